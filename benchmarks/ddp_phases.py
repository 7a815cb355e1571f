"""Where a DDP step's time goes, against the same step without communication and against a plain
all_reduce of the same bytes in the same processes.

    python benchmarks/ddp_phases.py                      # 2 ranks, 784-4096-4096-10, 30 timed steps
    python benchmarks/ddp_phases.py --sizes 784 256 10 --ranks 2 --steps 200
    python benchmarks/ddp_phases.py --flush       # no-comm also all-reduces as many bytes before its update

Per rank, median ms of: forward, backward, sync (ddp.sync_gradients: the bucket all-reduces when they
are not overlapped with backward), update (ddp.update_parameters after the sync: the optimizer and
zeroing the gradients); the no-communication step runs the model's own forward, backward, optimizer
step and zero_grad in the same ranks (their rounds alternate); then an all_reduce (AVG) of as many
float32 as the model has parameters, alone. If sync is close to that all_reduce, DDP adds nothing of its
own beyond the reduction; the rest of the gap is the reduction itself. With --flush the no-comm step
all-reduces an unrelated buffer of the same size (its "sync") before its optimizer step: if its update
then slows as DDP's does, the difference was the caches the exchange evicted, not DDP. One thread per rank.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("CYXWIZ_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import pycyxwiz as cx  # noqa: E402
from mlp import build_cx  # noqa: E402 - the MLP, its loss and Adam, as the other benchmarks build them


def rank_main(local_rank, sizes, steps, rounds, flush=False):
    D = cx.distributed
    D.init()
    r = D.get_rank()
    rng = np.random.default_rng(r)
    X = rng.standard_normal((64, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], 64)
    plain, loss, opt_plain = build_cx(cx, sizes)
    replica, _, opt_ddp = build_cx(cx, sizes)
    ddp = D.DistributedDataParallel(replica)

    def ddp_step():
        t0 = time.perf_counter()
        out = ddp.forward(X)
        t1 = time.perf_counter()
        ddp.backward(loss.backward(out, y))
        t2 = time.perf_counter()
        ddp.sync_gradients()
        t3 = time.perf_counter()
        ddp.update_parameters(opt_ddp)
        return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3

    def plain_step():
        t0 = time.perf_counter()
        out = plain.forward(X)
        t1 = time.perf_counter()
        plain.backward(loss.backward(out, y))
        t2 = time.perf_counter()
        if flush:
            D.all_reduce(other, op=D.ReduceOp.AVG)
        t3 = time.perf_counter()
        opt_plain.step(plain)
        plain.zero_grad()
        return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3

    other = np.ones(plain.num_parameters(), np.float32)  # --flush: as many bytes as the gradients
    times = {"ddp": [], "no-comm": []}
    for _ in range(rounds):
        for name, step in (("ddp", ddp_step), ("no-comm", plain_step)):
            for _ in range(3):
                step()
            D.barrier()
            times[name] += [step() for _ in range(steps)]
    grads = np.ones(plain.num_parameters(), np.float32)
    for _ in range(3):
        D.all_reduce(grads, op=D.ReduceOp.AVG)
    ar = []
    for _ in range(steps):
        D.barrier()
        t = time.perf_counter()
        D.all_reduce(grads, op=D.ReduceOp.AVG)
        ar.append(time.perf_counter() - t)
    out = {name: (np.median(np.array(v), axis=0) * 1e3).tolist() + [float(np.median(np.sum(v, axis=1)) * 1e3)]
           for name, v in times.items()}
    out["all_reduce"] = float(np.median(ar) * 1e3)
    out["bytes"] = grads.nbytes
    out["transport"] = D.get_config().transport
    D.finalize()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[784, 4096, 4096, 10])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of each kind of step")
    p.add_argument("--flush", action="store_true",
                   help="the no-comm step all-reduces a buffer of the gradients' size before its update")
    a = p.parse_args()
    results = cx.distributed.spawn(rank_main, (a.sizes, a.steps, a.rounds, a.flush), nprocs=a.ranks, timeout=1800)
    model = "-".join(map(str, a.sizes))
    print(f"{model}, {a.ranks} ranks, transport {results[0]['transport']}, median ms per rank "
          f"(all_reduce: {results[0]['bytes'] / 1e6:.1f} MB of float32, AVG)\n")
    print("| rank | step | forward | backward | sync | update | total | all_reduce alone |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r, res in enumerate(results):
        for name in ("ddp", "no-comm"):
            f, b, s, u, t = res[name]
            alone = f"{res['all_reduce']:.2f}" if name == "ddp" else ""
            print(f"| {r} | {name} | {f:.2f} | {b:.2f} | {s:.2f} | {u:.2f} | {t:.2f} | {alone} |")


if __name__ == "__main__":
    main()
