#!/usr/bin/env python3
"""Issue 14, item 1: a query that returns cudaErrorNotReady, then a kernel launch, must not fail.

The CUDA runtime records every error a call returns, cudaErrorNotReady from cudaEventQuery or
cudaStreamQuery included, as the calling thread's last error. pycyxwiz's launches read that state
(cudaGetLastError after <<<>>>), so a NotReady left there by a poll makes the next launch on the same
thread report "device not ready". Through the public API only:

  nccl  NCCL backend, world size 1. Long GEMMs are queued on the compute stream (a LinearModule on a
        size x size batch, repeated until about --target-ms of GPU time, measured first); an
        async_op=True all_reduce then waits for them on the communication stream, so Work.is_completed()
        (cudaEventQuery on the collective's event) must return False. Right after it, on the same
        thread, a ReLU kernel is launched (a ReLUModule's forward on a GPU tensor): it must succeed, and
        after a synchronisation its result must equal numpy's, the all_reduce's too.
  oom   no NCCL (there is no public query of the compute stream): a forward whose output cannot fit
        in the GPU's memory fails with out of memory (cudaMallocAsync's error, returned through
        CX_CUDA_TRY, also stays as the last error); then the same ReLU launch must succeed. Real GPUs
        only by default: an emulator would try to allocate the memory on the host.

    python tests/gpu/checks/notready_then_launch.py [--variant nccl|oom|all] [--size 8192] [--target-ms 300]

Prints one JSON line per run (all variants in it), exits 0 pass, 1 the launch failed or a result is
wrong, 2 inconclusive (NotReady or out of memory could not be produced), 3 hung (watchdog).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
from _common import FAIL, INCONCLUSIVE, PASS, Watchdog, emit, free_port, is_emulated, nccl_env


def gpu(cx, a) -> object:
    return cx.Tensor(np.ascontiguousarray(a, dtype=np.float32)).to("cuda:0")


def relu_model(cx):
    m = cx.SequentialModel()
    m.add(cx.ReLUModule())
    return m.to("cuda:0")


def launch_relu(cx, model, x_host, x_dev) -> dict:
    """The launch under test, then (after a synchronisation) its result against numpy."""
    out = {"launch_error": None, "result_ok": False}
    try:
        y = model.forward(x_dev)
    except Exception as e:  # noqa: BLE001 - the bug shows as an exception here
        out["launch_error"] = f"{type(e).__name__}: {e}"
        return out
    cx.cuda.synchronize(0)
    out["result_ok"] = bool(np.array_equal(np.asarray(y), np.maximum(x_host, 0)))
    return out


def gemm_model(cx, size: int):
    m = cx.SequentialModel()
    m.add(cx.LinearModule(size, size))
    return m.to("cuda:0")


def variant_nccl(cx, args) -> dict:
    import pycyxwiz.distributed as D

    os.environ.update(nccl_env(0, 1, free_port()))
    D.init()
    res = {"backend": D.get_backend()}
    rng = np.random.default_rng(1)
    big = gemm_model(cx, args.size)
    xb = gpu(cx, rng.standard_normal((args.size, args.size)) / math.sqrt(args.size))
    relu = relu_model(cx)
    x_host = rng.standard_normal(4099).astype(np.float32)
    x_dev = gpu(cx, x_host)
    c_host = rng.standard_normal(1031).astype(np.float32)
    c_dev = gpu(cx, c_host)
    # Calibrate: one warm-up (cuBLAS plans), then one timed GEMM.
    big.forward(xb)
    cx.cuda.synchronize(0)
    t0 = time.perf_counter()
    big.forward(xb)
    cx.cuda.synchronize(0)
    per_ms = (time.perf_counter() - t0) * 1e3
    n = max(1, min(args.max_gemms, math.ceil(args.target_ms / max(per_ms, 1e-3))))
    res.update(size=args.size, gemm_ms=round(per_ms, 3), gemms=n)

    t0 = time.perf_counter()
    outs = [big.forward(xb) for _ in range(n)]  # queued on the compute stream; kept alive until the end
    work = D.all_reduce(c_dev, async_op=True)   # the communication stream waits for the GEMMs
    polls, seen = 0, False
    while polls < args.polls and not seen:       # one poll is enough; retry a few times in case
        polls += 1
        seen = not work.is_completed()
    res.update(queue_ms=round((time.perf_counter() - t0) * 1e3, 3), polls=polls, not_ready_seen=seen)
    res.update(launch_relu(cx, relu, x_host, x_dev))  # the launch right after the NotReady poll
    work.wait(timeout=args.timeout)
    cx.cuda.synchronize(0)
    res["busy_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    res["allreduce_ok"] = bool(np.array_equal(np.asarray(c_dev), c_host))  # world of one: SUM is identity
    del outs
    D.finalize()
    if res["launch_error"] or not res["result_ok"] or not res["allreduce_ok"]:
        res["verdict"] = "fail"
    elif not seen:
        res["verdict"] = "inconclusive"
        res["why"] = "Work.is_completed() never returned False: the GEMMs finished before the poll (raise --size or --target-ms; a synchronous emulator never reports NotReady)"
    else:
        res["verdict"] = "pass"
    return res


def variant_oom(cx, args) -> dict:
    total = int(cx.cuda.get_device_properties(0)["total_memory"])
    want = int(total * args.oom_factor)
    cols = 1 << 16
    rows = max(1, want // (4 * cols))
    res = {"total_memory": total, "requested_bytes": rows * cols * 4}
    m = cx.SequentialModel()
    m.add(cx.LinearModule(1, cols))     # (rows, 1) @ (1, cols): a tiny input, an output that cannot fit
    m.to("cuda:0")
    relu = relu_model(cx)
    x_host = np.random.default_rng(2).standard_normal(4099).astype(np.float32)
    x_dev = gpu(cx, x_host)
    cx.cuda.synchronize(0)
    try:
        m.forward(gpu(cx, np.ones((rows, 1), np.float32)))
        res["oom_error"] = None
    except Exception as e:  # noqa: BLE001 - expected: out of memory
        res["oom_error"] = f"{type(e).__name__}: {e}"[:500]
    res.update(launch_relu(cx, relu, x_host, x_dev))
    if res["launch_error"] or not res["result_ok"]:
        res["verdict"] = "fail"
    elif not res["oom_error"] or "memory" not in res["oom_error"].lower():
        res["verdict"] = "inconclusive"
        res["why"] = "the oversized forward did not fail with out of memory"
    else:
        res["verdict"] = "pass"
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=["nccl", "oom", "all"], default="all",
                   help="all (default): nccl, plus oom on a real GPU")
    p.add_argument("--size", type=int, default=8192, help="GEMM size (default 8192; 256 under the emulator)")
    p.add_argument("--target-ms", type=float, default=300.0, help="GPU time of the queued GEMMs (default 300)")
    p.add_argument("--max-gemms", type=int, default=64)
    p.add_argument("--polls", type=int, default=3)
    p.add_argument("--oom-factor", type=float, default=2.0, help="oom: output bytes / the GPU's memory")
    p.add_argument("--timeout", type=float, default=60.0, help="bound of the whole check, seconds (watchdog +10)")
    args = p.parse_args()

    result = {"check": "notready_then_launch", "item": 1, "variants": {}}
    dog = Watchdog(result)
    dog.arm("setup", args.timeout + 10)
    import pycyxwiz as cx

    if not cx.cuda.is_available():
        result.update(verdict="inconclusive", why=cx.cuda.unavailable_reason())
        emit(result)
        return INCONCLUSIVE
    emulated = is_emulated(cx)
    result.update(device=cx.cuda.get_device_name(0), emulated=emulated)
    variants = [args.variant] if args.variant != "all" else (["nccl"] if emulated else ["nccl", "oom"])
    for v in variants:
        dog.arm(v, args.timeout + 10)
        try:
            result["variants"][v] = (variant_nccl if v == "nccl" else variant_oom)(cx, args)
        except Exception as e:  # noqa: BLE001 - reported in the JSON line
            result["variants"][v] = {"verdict": "fail", "error": f"{type(e).__name__}: {e}"[:2000]}
    dog.disarm()
    verdicts = [r["verdict"] for r in result["variants"].values()]
    result["verdict"] = "fail" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "pass"
    emit(result)
    return {"pass": PASS, "fail": FAIL}.get(result["verdict"], INCONCLUSIVE)


if __name__ == "__main__":
    sys.exit(main())
