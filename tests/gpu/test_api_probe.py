"""The CUDA library's own behaviour, driven through its ABI by tests/gpu/probes/api_probe.cpp (built
here with g++): the runtime's error state after a "not ready" answer or a caught out-of-memory
(issue 14 item 1), frees the runtime refuses (item 10), a cuda:0 -> cuda:1 copy ordered on both
devices (item 4) and NCCL's finalize with a graph holding a collective (item 2). They run on a real
GPU and under the host emulator (tests/gpu/emulator), whose streams run asynchronously, so the
ordering bugs show there too."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from gpu_support import GPU_COUNT, ROOT, gpu_skip_reason

import pycyxwiz as cx

pytestmark = pytest.mark.skipif(not cx.cuda.is_available(), reason=gpu_skip_reason())

EMULATED = os.environ.get("CYXWIZ_CUDA_LIBRARY", "").endswith("libcyxwiz_cuda_emulated.so")
# GEMM size that keeps the device busy for a while: the host emulator is some 10^4 times slower.
SIZE = "160" if EMULATED else "4096"


def library() -> str:
    return os.environ.get("CYXWIZ_CUDA_LIBRARY") or str(Path(cx.__file__).parent / "libcyxwiz_cuda.so")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    exe = tmp_path_factory.mktemp("probe") / "api_probe"
    subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", f"-I{ROOT / 'cpp'}",
                    str(ROOT / "tests/gpu/probes/api_probe.cpp"), "-ldl", "-pthread", "-o", str(exe)],
                   check=True, timeout=120)
    return exe


def run_probe(probe, check: str, *args: str, env=None, timeout=120) -> dict:
    p = subprocess.run([str(probe), library(), check, *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{check}: no result (rc={p.returncode})\nstdout: {p.stdout}\nstderr: {p.stderr[-3000:]}"
    result = json.loads(lines[-1])
    result["rc"], result["stderr"] = p.returncode, p.stderr[-3000:]
    return result


@pytest.mark.parametrize("check", ["notready", "stream_notready"])
def test_a_launch_after_a_not_ready_answer_succeeds(probe, check):
    """cudaEventQuery/cudaStreamQuery answering cudaErrorNotReady record it as the thread's last error;
    the next kernel launch must not report it as its own failure."""
    r = run_probe(probe, check, SIZE)
    assert r["not_ready_seen"], f"the device finished the GEMMs before the query: make SIZE larger ({r})"
    assert r["ok"], r


def test_a_launch_after_a_caught_out_of_memory_succeeds(probe):
    r = run_probe(probe, "oom_then_launch")
    assert r["malloc"], f"a 1 PiB allocation succeeded: {r}"
    assert r["ok"], r


def test_a_free_inside_a_capture_of_older_memory_is_named_and_refused(probe):
    r = run_probe(probe, "free_in_capture")
    assert r["ok"], r


def test_a_free_the_runtime_refuses_is_reported(probe):
    r = run_probe(probe, "free_error")
    assert r["ok"], r


@pytest.mark.skipif(GPU_COUNT < 2, reason="needs two GPUs (CYXWIZ_EMULATED_GPUS=2 under the emulator)")
def test_a_peer_copy_waits_for_the_source_device_and_orders_its_free(probe):
    r = run_probe(probe, "peer_copy", SIZE)
    assert r["ok"], r


def test_nccl_finalize_returns_once_the_graph_holding_its_collective_is_destroyed(probe):
    """The order the engine keeps at finalize (NcclBackend::shutdown drops its graphs first)."""
    r = run_probe(probe, "finalize_graph", SIZE, "30", env={"PROBE_DESTROY_GRAPH_FIRST": "1"}, timeout=90)
    assert r["ok"], r
    assert r["seconds"] < 15, r
