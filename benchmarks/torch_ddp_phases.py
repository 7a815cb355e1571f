"""Where PyTorch DDP's exposed communication goes on backend "cyxwiz": the variants of one step and its
phases, measured in the same two processes, rounds interleaved.

    python benchmarks/torch_ddp_phases.py                          # 784-4096-4096-10, 2 ranks
    python benchmarks/torch_ddp_phases.py --out benchmarks/results/torch_ddp_phases_2core
    python benchmarks/torch_ddp_phases.py --model 784-256-10 --steps 40
    python benchmarks/torch_ddp_phases.py --quick                  # smoke run

Each rank (one thread, torch.set_num_threads(1)) holds one copy of the model per variant, the same
initial weights, Adam (fused=True, the fair optimizer of BASELINES.md; --adam default: foreach),
cross-entropy, batch 64 of its own data:

- compute: no DDP, no communication: the bound.
- ddp: torch.nn.parallel.DistributedDataParallel with its defaults over "cyxwiz" (the default group),
  whose async all_reduces follow DDP's overlap policy: on the communication thread with 2 cores per rank
  on the host, else on the calling thread (CYXWIZ_DDP_OVERLAP in the environment forces either).
- ddp bucket view: the same with gradient_as_bucket_view=True (no copy of the buckets back into .grad).
- ddp comm thread: DDP over a second "cyxwiz" group made with CYXWIZ_DDP_OVERLAP=1: every bucket's
  all_reduce handed to the communication thread, overlapping backward whether or not a core is free.
- ddp gloo: DDP over a gloo group of the same processes.

Phases, on the compute copy's gradients after its step, each timed alone: "copy in" (every gradient
scaled by 1/world size into one flat buffer, as the reducer's copy into its buckets does), "all_reduce"
(that buffer, SUM, through torch.distributed on "cyxwiz"), "copy out" (the buffer back into .grad).
A time is the slowest rank's median over a round's steps, then the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from torch_backend import communicate_all, free_port

WORKER = r'''
import json, os, statistics, sys, time
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import pycyxwiz.torch  # noqa: F401  registers "cyxwiz"

sizes, steps, rounds = [int(s) for s in sys.argv[1].split("-")], int(sys.argv[2]), int(sys.argv[3])
fused = sys.argv[4] == "fused"
torch.set_num_threads(1)
dist.init_process_group("cyxwiz")
rank, ws = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
overlap = os.environ.get("CYXWIZ_DDP_OVERLAP")
os.environ["CYXWIZ_DDP_OVERLAP"] = "1"  # read when a group is made
threaded = dist.new_group(backend="cyxwiz")
if overlap is None:
    del os.environ["CYXWIZ_DDP_OVERLAP"]
else:
    os.environ["CYXWIZ_DDP_OVERLAP"] = overlap


def build():
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)
    return model


variants = {}
plain = build()
variants["compute"] = plain
variants["ddp"] = nn.parallel.DistributedDataParallel(build())
variants["ddp bucket view"] = nn.parallel.DistributedDataParallel(build(), gradient_as_bucket_view=True)
variants["ddp comm thread"] = nn.parallel.DistributedDataParallel(build(), process_group=threaded)
variants["ddp gloo"] = nn.parallel.DistributedDataParallel(build(), process_group=gloo)
opts = {name: torch.optim.Adam(m.parameters(), lr=1e-3, fused=fused) for name, m in variants.items()}

rng = np.random.RandomState(rank)
xs = [torch.from_numpy(rng.standard_normal((64, sizes[0])).astype(np.float32)) for _ in range(4)]
ys = [torch.from_numpy(rng.randint(0, sizes[-1], 64)) for _ in range(4)]
grads = [p.grad for p in plain.parameters()]


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return float(t) * 1e3


def step(name, i):
    m, opt = variants[name], opts[name]
    opt.zero_grad()
    nn.functional.cross_entropy(m(xs[i % 4]), ys[i % 4]).backward()
    opt.step()


flat = torch.empty(sum(g.numel() for g in plain.parameters()))
views, at = [], 0
for p in plain.parameters():
    views.append(flat[at:at + p.numel()].view_as(p))
    at += p.numel()
scale = 1.0 / ws


def copy_in():
    for g, v in zip(grads, views):
        torch.mul(g, scale, out=v)


def copy_out():
    for g, v in zip(grads, views):
        g.copy_(v)


phases = {"copy in": copy_in, "all_reduce": lambda: dist.all_reduce(flat), "copy out": copy_out}
for name in variants:  # warm-up: buckets rebuilt after the first iteration, allocator caches
    for i in range(3):
        step(name, i)
grads = [p.grad for p in plain.parameters()]
result = {name: [] for name in list(variants) + list(phases)}
for r in range(rounds):
    for name in variants:
        times = []
        for i in range(steps):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            step(name, i)
            times.append(slowest(time.perf_counter() - t0))
        result[name].append(statistics.median(times))
    for name, phase in phases.items():
        times = []
        for i in range(max(3, steps // 2)):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            phase()
            times.append(slowest(time.perf_counter() - t0))
        result[name].append(statistics.median(times))
same = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for name, m in variants.items() if name != "compute"]
agree = all(torch.equal(same[0], s) for s in same[1:])
dist.destroy_process_group()
if rank == 0:
    print("RESULT " + json.dumps({"ms": {k: statistics.median(v) for k, v in result.items()},
                                  "rounds": result, "ddp_variants_agree": agree,
                                  "parameters": sum(p.numel() for p in plain.parameters())}), flush=True)
'''


def run(model: str, steps: int, rounds: int, world: int, adam: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        port = free_port()
        procs = []
        for r in range(world):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_", "OMPI_"))}
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, script, model, str(steps), str(rounds), adam], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        outs = communicate_all(procs, timeout)
    lines = [ln for ln in outs[0][0].splitlines() if ln.startswith("RESULT ")]
    if not lines or any(p.returncode != 0 for p in procs):
        sys.exit("a rank failed:\n" + "\n".join(err[-3000:] for _, err in outs))
    return json.loads(lines[-1][len("RESULT "):])


def table(res: dict, model: str, world: int, adam: str) -> str:
    ms = res["ms"]
    base = ms["compute"]
    rows = [f"# PyTorch DDP's step and its phases, backend \"cyxwiz\" ({world} ranks, one thread each; "
            f"{model}, {res['parameters']:,} parameters, Adam ({adam}), batch 64 per rank)", "",
            "| variant | ms/step | exposed ms (step - compute) | step / compute |", "| --- | ---: | ---: | ---: |"]
    for name in ("compute", "ddp", "ddp bucket view", "ddp comm thread", "ddp gloo"):
        rows.append(f"| {name} | {ms[name]:.2f} | {ms[name] - base:.2f} | {ms[name] / base:.3f} |")
    rows += ["", "| phase (alone, after a step) | ms |", "| --- | ---: |"]
    rows += [f"| {name} | {ms[name]:.2f} |" for name in ("copy in", "all_reduce", "copy out")]
    rows += ["", f"The DDP variants end with the same parameters: {res['ddp_variants_agree']}.",
             "Per round (ms): " + "; ".join(f"{k} {', '.join(f'{v:.1f}' for v in vs)}" for k, vs in res["rounds"].items())]
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="784-4096-4096-10")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--adam", choices=["fused", "default"], default="fused")
    ap.add_argument("--quick", action="store_true", help="smoke run: 784-256-10, 3 steps, 1 round")
    ap.add_argument("--out", help="write OUT.md and OUT.json")
    args = ap.parse_args()
    if args.quick:
        args.model, args.steps, args.rounds = "784-256-10", 3, 1
    res = run(args.model, args.steps, args.rounds, args.world_size, args.adam, timeout=900)
    text = table(res, args.model, args.world_size, args.adam)
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
