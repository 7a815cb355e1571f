"""Memory per rank of DistributedDataParallel with and without the sharded optimizer step
(DDPConfig.shard_optimizer), after a few Adam steps of the benchmark MLP.

    python benchmarks/ddp_memory.py                      # 2 ranks, the large model (784-4096-4096-10)
    python benchmarks/ddp_memory.py --world-size 4 --model small

Per rank, from /proc/self/status: VmHWM (peak resident), RssAnon (private memory: parameters and
optimizer state when not sharded) and RssShmem (shared memory this rank touched: its own buckets and
the parts of the others' it read). Private memory plus the rank's own shared buffers is what the
rank adds to the machine; the shared figure counts a peer's pages again wherever they are read.
Linux only.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mlp import MODELS, build_cx  # noqa: E402


def worker(local_rank, model, shard, steps):
    import numpy as np

    import pycyxwiz as cx

    D = cx.distributed
    D.init()
    cfg = D.DDPConfig()
    cfg.shard_optimizer = shard
    m, lossfn, opt = build_cx(cx, MODELS[model], 0)
    ddp = D.DistributedDataParallel(m, cfg)
    rng = np.random.default_rng(D.get_rank())
    X = rng.standard_normal((64, MODELS[model][0])).astype(np.float32)
    y = rng.integers(0, MODELS[model][-1], 64)
    for _ in range(steps):
        ddp.backward(lossfn.backward(ddp.forward(X), y))
        ddp.update_parameters(opt)
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    mib = {k: int(status[k].split()[0]) / 1024 for k in ("VmHWM", "RssAnon", "RssShmem")}
    D.finalize()
    return mib


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", choices=sorted(MODELS), default="large")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()

    import pycyxwiz as cx

    sizes = MODELS[args.model]
    params = sum(sizes[i] * sizes[i + 1] + sizes[i + 1] for i in range(len(sizes) - 1))
    print(f"{args.model} {'-'.join(map(str, sizes))} ({params:,} parameters, {params * 4 / 2**20:.1f} MiB), "
          f"{args.world_size} ranks, Adam, after {args.steps} steps; MiB per rank (max over ranks)\n")
    print("| step | peak resident (VmHWM) | private (RssAnon) | shared touched (RssShmem) |")
    print("| --- | --: | --: | --: |")
    for shard in (False, True):
        out = cx.distributed.spawn(worker, args=(args.model, shard, args.steps), nprocs=args.world_size, timeout=300)
        worst = {k: max(r[k] for r in out) for k in out[0]}
        print(f"| {'sharded' if shard else 'plain'} | {worst['VmHWM']:.0f} | {worst['RssAnon']:.0f} | "
              f"{worst['RssShmem']:.0f} |")


if __name__ == "__main__":
    main()
