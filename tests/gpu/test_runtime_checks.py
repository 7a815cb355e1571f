"""The direct checks of issue 14's items 1 and 2 (tests/gpu/checks/), run as they run on a real GPU
(tests/gpu/run_on_gpu.sh), here in subprocesses with a hard timeout, every process killed at the end.

  * item 1: a poll that returns cudaErrorNotReady (Work.is_completed() of an async all_reduce queued
    behind long GEMMs), then a kernel launch on the same thread: the launch must succeed and its
    result equal numpy's. Needs a runtime that reports NotReady: a GPU, or an emulator whose streams
    run asynchronously (the JSON says "inconclusive" otherwise, and the test fails saying so).
  * item 2: finalize() (explicit, and the atexit one) while a TrainStep(cuda_graphs=True) whose graph
    holds the DDP all-reduce is alive: it must return within 8 s (at world size 1 and 2 it takes well
    under a second when healthy; the stuck path is a 10 s wait, then an abort that hangs) and the
    ranks must exit. Needs 2 GPUs (DDP reduces nothing at world size 1): CYXWIZ_EMULATED_GPUS=2.

Under an emulator that models NotReady in the last-error state and NCCL >= 2.26's finalize waiting for
graphs, both fail on code without the fixes.
"""

from __future__ import annotations

import json
import sys

import pytest
from gpu_support import ROOT, requires_two_gpus
from harness import rank_env

import pycyxwiz as cx

CHECKS = ROOT / "tests" / "gpu" / "checks"
EMULATED = cx.cuda.is_available() and cx.cuda.get_device_name(0) == "pycyxwiz host emulator"


def run_check(ranks, script: str, args: list[str], timeout: float) -> tuple[int, dict, str]:
    """(exit status, the check's JSON line, its output) of one check in its own session."""
    r = ranks.finish(ranks.popen([sys.executable, CHECKS / script, *args], rank_env()), timeout)
    rc, out, err = r.rc, r.out, r.err
    report = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            report = json.loads(line)
            break
    assert report is not None, f"{script} printed no JSON line (exit {rc})\n--- stdout\n{out}\n--- stderr\n{err}"
    return rc, report, f"--- stdout\n{out}\n--- stderr\n{err[-4000:]}"


def test_a_launch_after_a_not_ready_poll_succeeds(ranks, gpu):
    # The emulator's GEMMs run on the host: a small size, the number of GEMMs calibrated to 300 ms.
    args = ["--variant", "nccl", "--size", "256"] if EMULATED else []
    rc, rep, log = run_check(ranks, "notready_then_launch.py", args + ["--timeout", "90"], timeout=150)
    nccl = rep["variants"].get("nccl", {})
    assert nccl.get("not_ready_seen"), f"Work.is_completed() never returned False: nothing was checked\n{log}"
    assert nccl.get("launch_error") is None, f"the launch after a NotReady poll failed: {nccl['launch_error']}\n{log}"
    assert nccl.get("result_ok") and nccl.get("allreduce_ok"), log
    for name, v in rep["variants"].items():  # oom, on a real GPU
        assert v["verdict"] == "pass", f"{name}: {v}\n{log}"
    assert rc == 0 and rep["verdict"] == "pass", log


@requires_two_gpus
@pytest.mark.parametrize("at_exit", [False, True], ids=["finalize", "atexit-finalize"])
def test_finalize_with_a_graphed_step_alive_returns(ranks, at_exit):
    args = ["--world-size", "2", "--bound", "8"] + (["--at-exit"] if at_exit else [])
    rc, rep, log = run_check(ranks, "finalize_with_graph_alive.py", args, timeout=240)
    assert rep["verdict"] != "hung", f"finalize hung with a graphed step alive ({rep.get('ranks')})\n{log}"
    for r in rep["ranks"]:
        assert r.get("graphed") and r.get("replays", 0) >= 1, f"rank {r.get('rank')}: the step was not graphed\n{log}"
        assert r["rc"] == 0, f"rank {r['rank']} exited {r['rc']}\n{log}"
        assert r.get("finalize_s", 1e9) <= 8, f"rank {r['rank']}: finalize took {r.get('finalize_s')} s\n{log}"
    assert rc == 0 and rep["verdict"] == "pass", log
