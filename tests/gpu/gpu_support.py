"""What the GPU tests share: the rank-script preludes and oracles of tests/distributed and the example
helpers of tests/test_examples.py (imported from there, not copied), and whether this process can use
a GPU. The process harness (ranks, free_port, rank_env) is tests/harness.py.

tests/ and tests/distributed are on sys.path (pyproject.toml's pythonpath), so their modules import by
name. Import the names you need explicitly (never `from gpu_support import *`: the test modules' test
functions would be collected a second time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# tests/distributed/test_collectives.py: seeded per-rank inputs (make), the numpy oracle
# (oracle_check), expect/expect_raises, and `outputs` (every rank exited 0 and reported no errors).
# tests/distributed/test_ddp.py: build(seed), batch(step, n), shard, make_opt, oracle, check_params,
# finish() printing "RESULT {json}"; reports_of reads them, assert_same_digest compares the ranks.
# tests/test_examples.py: the examples folder, the check that a saved model loads and predicts, the
# epoch lines of the trainer's output, and the command that runs an example with this interpreter.
from test_collectives import PRELUDE as COLLECTIVES_PRELUDE
from test_collectives import outputs as collective_reports
from test_ddp import PRELUDE as DDP_PRELUDE
from test_ddp import assert_same_digest
from test_ddp import records as ddp_records
from test_ddp import reports_of as ddp_reports
from test_examples import EXAMPLES, check_model, epoch_lines
from test_examples import python as example_command

import pycyxwiz as cx

ROOT = Path(__file__).resolve().parents[2]


def close(got, want, what, tol):
    """got == want within tol["rtol"] and tol["atol"] times the largest |want| (at least 1)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got, want, err_msg=what, rtol=tol["rtol"], atol=tol["atol"] * scale)


def seq(*layers):
    m = cx.SequentialModel()
    for layer in layers:
        m.add(layer)
    return m


def twins(layers, seed=0):
    """The same model (layers() makes its layers) from the same seed, on the CPU and on cuda:0."""
    cx.manual_seed(seed)
    cpu = seq(*layers())
    cx.manual_seed(seed)
    gpu = seq(*layers()).to("cuda")
    assert gpu.device == "cuda:0"
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert np.array_equal(p, q)
    return cpu, gpu


def gpu_skip_reason() -> str:
    """'no usable GPU: <why>' (the reason of a CUDA build without a driver already starts so)."""
    why = cx.cuda.unavailable_reason() or "cx.cuda.is_available() is False"
    return why if why.startswith("no usable GPU") else f"no usable GPU: {why}"


GPU_COUNT = cx.cuda.device_count()

# `pytestmark = requires_gpu` in a module whose every test needs a GPU (a skipif object, not a custom
# marker: pyproject.toml runs pytest with --strict-markers).
requires_gpu = pytest.mark.skipif(GPU_COUNT == 0, reason=gpu_skip_reason() if GPU_COUNT == 0 else "")
requires_two_gpus = pytest.mark.skipif(GPU_COUNT < 2, reason=f"needs 2 GPUs, this machine shows {GPU_COUNT}")
