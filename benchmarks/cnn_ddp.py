#!/usr/bin/env python3
"""The cost of data parallelism on a CNN: DDP step / no-communication step, N ranks on one machine.

    python benchmarks/cnn_ddp.py                     # 2 ranks, the 3-block CNN of cnn_step.py
    python benchmarks/cnn_ddp.py --world-size 2 --model resnet --sync-bn

Each rank (one thread, CYXWIZ_NUM_THREADS=1) trains the same model two ways in alternating rounds:
"ddp" wrapped in DistributedDataParallel (gradients averaged every step, buffers broadcast before each
forward; --sync-bn makes every BatchNorm a SyncBatchNorm) and "nocomm" the same model alone (the
compute-only ceiling of N busy ranks). Batch 32 of 3x32x32 per rank, Adam. Reported by rank 0: the
median step of each mode over all rounds and ratio = ddp / nocomm (1.0: communication costs nothing).
Ranks are started with cx.distributed.spawn on 127.0.0.1.
"""

import argparse
import os
import statistics
import time

import numpy as np


def rank_main(local_rank, args):
    import pycyxwiz as cx
    from cnn_step import BATCH, CLASSES, LR, MODELS

    dist = cx.distributed
    dist.init()
    cx.set_num_threads(1)
    make = MODELS[args.model][0]
    cx.manual_seed(0)
    wrapped = make()
    if args.sync_bn:
        dist.convert_sync_batchnorm(wrapped)
    cfg = dist.DDPConfig()
    cfg.broadcast_buffers = not args.no_broadcast_buffers
    ddp = dist.DistributedDataParallel(wrapped, cfg)
    cx.manual_seed(0)
    alone = make()
    opts = {"ddp": cx.AdamOptimizer(LR), "nocomm": cx.AdamOptimizer(LR)}
    loss = cx.CrossEntropyLoss()
    rng = np.random.default_rng(dist.get_rank())
    data = [(rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32), rng.integers(0, CLASSES, BATCH))
            for _ in range(args.steps)]

    def step(mode, x, y):
        if mode == "ddp":
            out = ddp.forward(x)
            ddp.backward(loss.backward(out, y))
            ddp.update_parameters(opts["ddp"])
        else:
            out = alone.forward(x)
            alone.zero_grad()
            alone.backward(loss.backward(out, y))
            opts["nocomm"].step(alone)

    times = {"ddp": [], "nocomm": []}
    for _ in range(args.rounds):
        for mode in ("ddp", "nocomm"):
            dist.barrier()
            for i, (x, y) in enumerate(data):
                t0 = time.perf_counter()
                step(mode, x, y)
                if i >= args.warmup:
                    times[mode].append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        ddp_ms, alone_ms = statistics.median(times["ddp"]) * 1e3, statistics.median(times["nocomm"]) * 1e3
        label = args.model + (" sync-bn" if args.sync_bn else "") + (" no-broadcast" if args.no_broadcast_buffers else "")
        print(f"| {label} | {dist.get_world_size()} | {ddp_ms:.1f} | "
              f"{alone_ms:.1f} | {ddp_ms / alone_ms:.3f} |", flush=True)
    dist.finalize()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", default="cnn3", choices=["cnn3", "resnet"])
    p.add_argument("--sync-bn", action="store_true")
    p.add_argument("--no-broadcast-buffers", action="store_true", help="DDPConfig.broadcast_buffers = False")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    os.environ["CYXWIZ_NUM_THREADS"] = "1"
    import pycyxwiz as cx

    print("| model | ranks | DDP step ms | no-comm step ms | DDP / no-comm |\n|---|---|---|---|---|", flush=True)
    cx.distributed.spawn(rank_main, args=(args,), nprocs=args.world_size, timeout=600)


if __name__ == "__main__":
    main()
