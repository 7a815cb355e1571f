"""PyTorch DDP and all_reduce over backend="cyxwiz" (pycyxwiz.torch) against backend="gloo", the same
script in one run, on one machine over loopback.

    python benchmarks/torch_backend.py                 # 2 ranks: the DDP models, then all_reduce 4 KiB..64 MiB
    python benchmarks/torch_backend.py --quick         # CI smoke run: small model, few steps and sizes
    python benchmarks/torch_backend.py --out benchmarks/results/torch_backend_2core

DDP (torch.nn.parallel.DistributedDataParallel, Adam, cross-entropy, each rank its own seeded
batches): warm-up steps, then timed steps; a step's time is the slowest rank's median. The parameters
both backends end with are compared. All-reduce: float32 SUM in place through torch.distributed with
each backend, and through cx.distributed.all_reduce on the same tensors (numpy views), median of the
slowest rank over the calls, a barrier before each. Every process has a timeout and is killed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r'''
import json, os, statistics, sys, time
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

backend, mode, arg, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(1)
if backend == "cyxwiz":
    import pycyxwiz.torch  # noqa: F401
dist.init_process_group(backend)
rank, ws = dist.get_rank(), dist.get_world_size()
out = {}


def slowest(times):
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return statistics.median(t.tolist())


if mode == "ddp":
    sizes = [int(s) for s in arg.split("-")]
    if sizes[0] == 0:  # the small CNN: 1x28x28 -> conv 8 -> conv 16 -> 10
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                              nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
        shape = (64, 1, 28, 28)
    else:
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        shape = (64, sizes[0])
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    rng = np.random.RandomState(rank)
    xs = [torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for _ in range(4)]
    ys = [torch.from_numpy(rng.randint(0, 10, shape[0])) for _ in range(4)]
    times = []
    for step in range(steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(xs[step % 4]), ys[step % 4]).backward()
        opt.step()
        if step >= 3:
            times.append(time.perf_counter() - t0)
    out["step_ms"] = slowest(times) * 1e3
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out["param_sum"] = float(params.double().sum())
    out["param_bytes"] = params.numpy().tobytes().hex()[:64] + str(params.numel())
    np.save(os.environ["BENCH_PARAMS"], params.numpy())
else:
    n = int(arg) // 4
    t = torch.ones(n)
    results = {}
    for how in (["torch", "cx"] if backend == "cyxwiz" else ["torch"]):
        if how == "cx":
            import pycyxwiz as cx
            cx.distributed.init()
            a = t.numpy()
        times = []
        for i in range(steps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            if how == "torch":
                dist.all_reduce(t)
            else:
                cx.distributed.all_reduce(a)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        results[how] = slowest(times) * 1e3
        if how == "cx":
            cx.distributed.finalize()
    out.update(results)
dist.destroy_process_group()
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(backend: str, mode: str, arg: str, steps: int, world: int, tmp: str, timeout: float) -> dict:
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    port, cx_port = free_port(), free_port()
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_", "OMPI_"))}
        env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CYXWIZ_MASTER_PORT=str(cx_port), OMP_NUM_THREADS="1",
                   CYXWIZ_NUM_THREADS="1", BENCH_PARAMS=os.path.join(tmp, f"{backend}-{arg}-{r}.npy"))
        procs.append(subprocess.Popen([sys.executable, script, backend, mode, arg, str(steps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.communicate()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"{backend} {mode} {arg}: rc={[p.returncode for p in procs]}\n{outs[0][1][-3000:]}")
    line = [ln for ln in outs[0][0].splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--out", help="write OUT.md and OUT.json")
    args = ap.parse_args()
    import numpy as np
    models = ["784-256-10"] if args.quick else ["784-256-10", "784-4096-4096-10", "0"]
    steps = {"784-256-10": 200, "784-4096-4096-10": 20, "0": 100}
    sizes = [4096, 1 << 20] if args.quick else [4096, 65536, 1 << 20, 16 << 20, 64 << 20]
    rows, ar = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            n = 10 if args.quick else steps[m]
            res = {b: run(b, "ddp", m, n, args.world_size, tmp, 600) for b in ("gloo", "cyxwiz")}
            equal = all(np.array_equal(np.load(os.path.join(tmp, f"gloo-{m}-{r}.npy")),
                                       np.load(os.path.join(tmp, f"cyxwiz-{m}-{r}.npy"))) for r in range(args.world_size))
            rows.append({"model": "small CNN (conv 8, conv 16, linear)" if m == "0" else m, "gloo_ms": res["gloo"]["step_ms"],
                         "cyxwiz_ms": res["cyxwiz"]["step_ms"], "speedup": res["gloo"]["step_ms"] / res["cyxwiz"]["step_ms"],
                         "params_equal": equal})
            print(rows[-1], flush=True)
        for size in sizes:
            iters = 20 if size >= (16 << 20) else 100
            if args.quick:
                iters = 10
            g = run("gloo", "allreduce", str(size), iters, args.world_size, tmp, 600)
            c = run("cyxwiz", "allreduce", str(size), iters, args.world_size, tmp, 600)
            ar.append({"bytes": size, "gloo_ms": g["torch"], "cyxwiz_torch_ms": c["torch"], "cx_ms": c["cx"],
                       "vs_gloo": g["torch"] / c["torch"], "torch_over_cx": c["torch"] / c["cx"]})
            print(ar[-1], flush=True)
    md = [f"# PyTorch DDP and all_reduce: backend \"cyxwiz\" vs \"gloo\" ({args.world_size} ranks, one machine, "
          f"{os.cpu_count()} cores, torch {__import__('torch').__version__})", "",
          "| model (DDP, Adam, batch 64 per rank) | gloo ms/step | cyxwiz ms/step | speed-up | parameters equal |",
          "| --- | --- | --- | --- | --- |"]
    md += [f"| {r['model']} | {r['gloo_ms']:.2f} | {r['cyxwiz_ms']:.2f} | {r['speedup']:.2f}x | {r['params_equal']} |"
           for r in rows]
    md += ["", "| all_reduce float32 | gloo (torch.distributed) ms | cyxwiz (torch.distributed) ms | "
           "cx.distributed.all_reduce ms | cyxwiz vs gloo | torch path / cx path |", "| --- | --- | --- | --- | --- | --- |"]
    md += [f"| {a['bytes'] // 1024} KiB | {a['gloo_ms']:.3f} | {a['cyxwiz_torch_ms']:.3f} | {a['cx_ms']:.3f} | "
           f"{a['vs_gloo']:.2f}x | {a['torch_over_cx']:.2f} |" for a in ar]
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"ddp": rows, "allreduce": ar, "world_size": args.world_size}, f, indent=1)


if __name__ == "__main__":
    main()
