"""What the GPU tests share: the multi-process harnesses of tests/distributed and tests/test_examples.py
(imported from there, not copied), and whether this process can use a GPU.

tests/ has no __init__.py, so tests/distributed/conftest.py and the test modules are not importable by
name from here; they are loaded by path under private module names. Import the names you need
explicitly (never `from gpu_support import *`: the loaded test modules' test functions would be
collected a second time).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import pycyxwiz as cx

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def _load(name: str, path: Path):
    """`path` as a module named `name` (registered first: dataclasses look their module up)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_harness = _load("_cyxwiz_gpu_tests_distributed_conftest", TESTS / "distributed" / "conftest.py")
_collectives = _load("_cyxwiz_gpu_tests_collectives", TESTS / "distributed" / "test_collectives.py")
_ddp = _load("_cyxwiz_gpu_tests_ddp", TESTS / "distributed" / "test_ddp.py")
_examples = _load("_cyxwiz_gpu_tests_examples", TESTS / "test_examples.py")

# tests/distributed/conftest.py: rank processes on 127.0.0.1, a free port, a hard timeout, all killed.
Ranks = _harness.Ranks
free_port = _harness.free_port

# tests/distributed/test_collectives.py: seeded per-rank inputs (make), the numpy oracle
# (oracle_check), expect/expect_raises, and `outputs` (every rank exited 0 and reported no errors).
COLLECTIVES_PRELUDE = _collectives.PRELUDE
collective_reports = _collectives.outputs

# tests/distributed/test_ddp.py: build(seed), batch(step, n), shard, make_opt, oracle, check_params,
# finish() printing "RESULT {json}"; reports_of reads them, assert_same_digest compares the ranks.
DDP_PRELUDE = _ddp.PRELUDE
ddp_reports = _ddp.reports_of
assert_same_digest = _ddp.assert_same_digest
ddp_records = _ddp.records

# tests/test_examples.py: processes in their own sessions, killed at the end; the launcher-free env.
Runner = _examples.Runner
clean_env = _examples.clean_env
EXAMPLES = _examples.EXAMPLES
check_model = _examples.check_model
epoch_lines = _examples.epoch_lines
example_command = _examples.python


def gpu_skip_reason() -> str:
    """'no usable GPU: <why>' (the reason of a CUDA build without a driver already starts so)."""
    why = cx.cuda.unavailable_reason() or "cx.cuda.is_available() is False"
    return why if why.startswith("no usable GPU") else f"no usable GPU: {why}"


GPU_COUNT = cx.cuda.device_count()

# `pytestmark = requires_gpu` in a module whose every test needs a GPU (a skipif object, not a custom
# marker: pyproject.toml runs pytest with --strict-markers).
requires_gpu = pytest.mark.skipif(GPU_COUNT == 0, reason=gpu_skip_reason() if GPU_COUNT == 0 else "")
requires_two_gpus = pytest.mark.skipif(GPU_COUNT < 2, reason=f"needs 2 GPUs, this machine shows {GPU_COUNT}")
