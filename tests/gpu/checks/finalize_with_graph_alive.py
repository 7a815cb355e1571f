#!/usr/bin/env python3
"""Issue 14, item 2: finalize() while a graphed training step is alive must return, and the process exit.

NCCL >= 2.26's ncclCommFinalize waits until every CUDA graph that captured a collective of the
communicator is destroyed. pycyxwiz's DDP step captures its gradient all-reduce into the graph of
TrainStep(..., cuda_graphs=True); if that graph is still alive at finalize(), finalize waits for it,
and after 10 s cuda/nccl.cpp aborts the communicator, whose ncclCommAbort joins the finalize thread
still waiting: the process hangs.

Each rank (NCCL backend, one GPU per rank, 127.0.0.1): a small model, DistributedDataParallel, a
TrainStep with cuda_graphs=True, --steps batches (the first eager, the second captured, the rest
replayed), then finalize() with the step still referenced, timed; then a normal exit (the step is
destroyed only at interpreter teardown). --at-exit: no explicit finalize(); the atexit finalize of
pycyxwiz.distributed runs with the step alive, as in a script that just ends.

DDP reduces gradients only at world size > 1, so only then does the graph hold a collective: with
one GPU (world size 1) the check still runs, and reports "inconclusive" (exit 2) with the reason.

    python tests/gpu/checks/finalize_with_graph_alive.py [--world-size N] [--bound 60] [--at-exit]

Prints one JSON line: per rank the finalize duration, graphed/replays; exits 0 when every rank
finished finalize within --bound seconds and exited 0; 1 when finalize took longer or a rank failed;
2 inconclusive; 3 hung (a rank's watchdog fired at bound + 10 s, or the launcher killed the ranks).
"""

from __future__ import annotations

import argparse
import atexit
import os
import subprocess
import sys
import time

from _common import FAIL, HUNG, INCONCLUSIVE, PASS, Watchdog, emit, free_port, last_json, nccl_env

SETUP_S = 120.0  # init + the steps, per rank (the emulator is slow; a GPU takes seconds)


def worker(args) -> int:
    """One rank. Its JSON line says how long finalize took."""
    result = {"rank": int(os.environ["RANK"])}
    dog = Watchdog(result)
    dog.arm("setup (init and steps)", SETUP_S)
    t_exit: list[float] = []
    if args.at_exit:
        # atexit runs handlers last-registered first: this one (registered before pycyxwiz's finalize)
        # runs after it and reports; the one registered after the import runs before it and times it.
        def report() -> None:
            dog.disarm()
            result["finalize_s"] = round(time.monotonic() - t_exit[0], 3)
            result["verdict"] = "pass" if result["finalize_s"] <= args.bound else "fail"
            emit(result)
        atexit.register(report)

    import numpy as np

    import pycyxwiz as cx
    import pycyxwiz.distributed as D

    if args.at_exit:
        atexit.register(lambda: (t_exit.append(time.monotonic()), dog.arm("finalize at exit", args.bound + 10)))
    D.init()
    result["backend"] = D.get_backend()
    result["world_size"] = D.get_world_size()
    rng = np.random.default_rng(5 + result["rank"])
    X = rng.standard_normal((16 * args.steps, 20)).astype(np.float32)
    y = rng.integers(0, 4, len(X)).astype(np.int64)
    cx.manual_seed(3)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(20, 32))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(32, 4))
    ddp = D.DistributedDataParallel(model)  # moves the model to cuda:LOCAL_RANK
    step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01), cuda_graphs=True)
    for i in range(args.steps):
        step(X[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
    loss = step.loss()  # waits for the last replay
    result.update(device=model.device, graphed=bool(step.graphed), replays=int(step.replays),
                  loss_finite=bool(np.isfinite(loss)))
    globals()["_keep"] = (step, ddp, model)  # alive until interpreter teardown, after finalize
    if args.at_exit:
        dog.disarm()
        return PASS
    dog.arm("finalize", args.bound + 10)
    t0 = time.monotonic()
    D.finalize()
    result["finalize_s"] = round(time.monotonic() - t0, 3)
    result["verdict"] = "pass" if result["finalize_s"] <= args.bound else "fail"
    dog.arm("exit after finalize", 30)
    emit(result)
    return PASS


def launch(args) -> int:
    """Starts the ranks (in this process group, so that whoever kills the group kills them too), waits
    with a hard bound, kills whatever is left."""
    import pycyxwiz as cx

    result = {"check": "finalize_with_graph_alive", "item": 2, "bound_s": args.bound, "at_exit": args.at_exit}
    gpus = cx.cuda.device_count()
    if gpus == 0:
        result.update(verdict="inconclusive", why=cx.cuda.unavailable_reason())
        emit(result)
        return INCONCLUSIVE
    ws = args.world_size or min(2, gpus)
    result.update(world_size=ws, gpus=gpus, device=cx.cuda.get_device_name(0))
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--bound", str(args.bound), "--steps", str(args.steps)]
    cmd += ["--at-exit"] if args.at_exit else []
    procs = [subprocess.Popen(cmd, env=nccl_env(r, ws, port), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ws)]
    deadline = time.monotonic() + SETUP_S + args.bound + 40
    ranks, killed = [], False
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed = True
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
        rep = last_json(out) or {"rank": r, "verdict": "fail", "why": "no JSON line"}
        rep["rc"] = p.returncode
        if p.returncode != 0 or rep.get("verdict") != "pass":
            rep["stderr_tail"] = err[-3000:]
        ranks.append(rep)
    result["ranks"] = ranks
    result["finalize_s"] = max((r.get("finalize_s", float("inf")) for r in ranks), default=None)
    if killed or any(r.get("verdict") == "hung" for r in ranks):
        result["verdict"], code = "hung", HUNG
    elif any(r["rc"] != 0 or r.get("verdict") != "pass" for r in ranks):
        result["verdict"], code = "fail", FAIL
    elif ws < 2 or not all(r.get("graphed") for r in ranks):
        result["verdict"], code = "inconclusive", INCONCLUSIVE
        result["why"] = ("world size 1: DDP reduces no gradients, so the graph holds no collective (needs 2 GPUs)"
                         if ws < 2 else "the step was not graphed (capture refused: see stderr_tail)")
        for r in ranks:
            r.setdefault("stderr_tail", "")
    else:
        result["verdict"], code = "pass", PASS
    emit(result)
    return code


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=0, help="ranks, one GPU each (default: min(2, GPUs))")
    p.add_argument("--bound", type=float, default=60.0, help="finalize must return within this, seconds (default 60)")
    p.add_argument("--steps", type=int, default=5, help="batches: 1 eager, 1 captured, the rest replayed")
    p.add_argument("--at-exit", action="store_true", help="no finalize(): the atexit one, at the script's end")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    return worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    sys.exit(main())
