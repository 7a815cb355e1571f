"""PyTorch DDP and all_reduce over backend="cyxwiz" (pycyxwiz.torch) against backend="gloo", the same
script in one run, on one machine over loopback.

    python benchmarks/torch_backend.py                 # 2 ranks: the DDP models, then all_reduce 4 KiB..64 MiB
    python benchmarks/torch_backend.py --quick         # CI smoke run: small model, few steps and sizes
    python benchmarks/torch_backend.py --out benchmarks/results/torch_backend_2core --plot benchmarks/results/torch_backend_2core.png
    python benchmarks/torch_backend.py --models 784-4096-4096-10 --repeats 3 --no-allreduce
    python benchmarks/torch_backend.py --world-size 8 --models 784-256-10,784-4096-4096-10 --steps 784-4096-4096-10=10
    python benchmarks/torch_backend.py --no-ddp --sizes 4096,1048576 --repeats 3

DDP (torch.nn.parallel.DistributedDataParallel, Adam, cross-entropy, each rank its own seeded
batches): warm-up steps, then timed steps; a step's time is the slowest rank's median. The parameters
each backend ends with are measured against a float64 reference: the same training with DDP replaced
by a float64 all-reduce of the same per-rank float32 gradients, rounded once to float32 after dividing
by the world size (the correctly rounded average, whatever the order of the float64 additions); the
distances are max |diff| / max |param| of the worst tensor and rms |diff| / rms |param| over all
parameters, on the worst rank, after the 3 warm-up steps (before drift can grow) and at the end. The backends add the same float32 numbers in different orders (gloo:
its ring, starting at a different rank for each segment; cyxwiz on one host: rank order, every
element; see REDUCTION_ORDER), so beyond 2 ranks they need not end bit-identical, to each other or to
the reference; at 2 ranks all three are the same bits.
"compute only" is the bound no backend can beat: the same model,
batches and optimizer, unwrapped (no DDP, no communication), on as many processes at once as the DDP
runs have, so that they share the cores and memory bandwidth as the DDP ranks do. step - compute only
is the communication a backend leaves exposed (plus DDP's own bucket copies). CPU ms is the process's
CPU time per step, every thread (the communication threads included).
All-reduce: float32 SUM in place through torch.distributed with each backend, and through
cx.distributed.all_reduce on the same tensor (a numpy view), the two cyxwiz paths interleaved call by
call, each after a barrier on its own communicator; median of the slowest rank over the calls.
--repeats N runs everything N times, interleaved, and reports the median run. Every process has a
timeout and is killed at the end. --plot needs matplotlib (a benchmark tool, not a dependency).
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
# "none": compute only; the group is there only to start together and to report the slowest rank.
# "ref": the float64 reference (DDP's training with the gradients averaged in float64 over gloo).
dist.init_process_group("gloo" if backend in ("none", "ref") else backend)
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
    ddp = model if backend in ("none", "ref") else nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    start = [p.detach().clone() for p in model.parameters()]

    def average_in_float64():
        # Every rank's float32 gradients, summed in float64 (exact unless their magnitudes span more than
        # 2^29; then still far below float32's rounding, so the order of these additions does not show
        # once rounded), divided by the world size and rounded once to float32.
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads]).double()
        dist.all_reduce(flat)
        flat = (flat / ws).float()
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()
    rng = np.random.RandomState(rank)
    xs = [torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for _ in range(4)]
    ys = [torch.from_numpy(rng.randint(0, 10, shape[0])) for _ in range(4)]
    dist.barrier()
    times, cpu = [], []
    for step in range(steps + 3):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(xs[step % 4]), ys[step % 4]).backward()
        if backend == "ref":
            average_in_float64()
        opt.step()
        if step == 2 and backend != "none":  # after the warm-up: before drift can grow (see distance())
            np.savez(os.environ["BENCH_PARAMS"] + ".early.npz", *[p.detach().numpy() for p in model.parameters()])
        if step >= 3:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    out["step_ms"] = slowest(times) * 1e3
    out["cpu_ms"] = slowest(cpu) * 1e3
    if backend != "none":
        np.savez(os.environ["BENCH_PARAMS"], *[p.detach().numpy() for p in model.parameters()])
    if backend == "ref":  # how far training moved the parameters: the scale of the distances
        out["moved"] = max(float((p.detach() - p0).abs().max() / p0.abs().max().clamp_min(1e-30))
                           for p, p0 in zip(model.parameters(), start))
else:
    n = int(arg) // 4
    t = torch.zeros(n)  # zeros: a sum that stays finite however many calls add into it
    calls = {"torch": lambda: dist.all_reduce(t)}
    barriers = {"torch": dist.barrier}
    if backend == "cyxwiz":
        import pycyxwiz as cx
        cx.distributed.init()
        a = t.numpy()
        calls["cx"] = lambda: cx.distributed.all_reduce(a)
        barriers["cx"] = cx.distributed.barrier
    times = {how: [] for how in calls}
    for i in range(steps + 3):
        for how, call in calls.items():  # interleaved: background load hits both paths alike
            barriers[how]()  # on the communicator the call then uses
            t0 = time.perf_counter()
            call()
            if i >= 3:
                times[how].append(time.perf_counter() - t0)
    out.update({how: slowest(v) * 1e3 for how, v in times.items()})
    if backend == "cyxwiz":
        cx.distributed.finalize()
dist.destroy_process_group()
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
'''

MODEL_NAMES = {"0": "small CNN (conv 8, conv 16, linear)"}
# The order in which each backend adds the ranks' float32 gradients (DDP scales each by 1/world size
# first, exact at power-of-two world sizes, then all-reduces with SUM).
REDUCTION_ORDER = {
    "gloo": "gloo's ring (gloo::allreduce, what ProcessGroupGloo runs for CPU tensors): a segment's partial sum "
            "travels round the ring, each rank adding its own value, starting at a rank that depends on the "
            "segment, so the order of additions changes along the tensor",
    "cyxwiz": "pycyxwiz's CPU backend; ranks on one host (this benchmark): shared memory, every element summed in "
              "rank order, ((g0 + g1) + g2) + ... (the chunked all-reduce and the small one alike); across hosts "
              "or with CYXWIZ_TRANSPORT=tcp: the TCP ring's order, which starts at a rank that depends on the chunk "
              "(recursive doubling up to 64 KiB at power-of-two world sizes >= 4, rank order for the smallest "
              "buffers); docs/distributed.md",
}
DDP_STEPS = {"784-256-10": 200, "784-4096-4096-10": 20, "0": 100}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def communicate_all(procs, timeout: float) -> list:
    """(stdout, stderr) of every rank process (each in its own session); any still running after the
    timeout, or when one fails, is killed with its group."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.communicate()


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
                   CYXWIZ_NUM_THREADS="1", BENCH_PARAMS=params_path(tmp, backend, arg, r))
        procs.append(subprocess.Popen([sys.executable, script, backend, mode, arg, str(steps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    outs = communicate_all(procs, timeout)
    lines = [ln for ln in outs[0][0].splitlines() if ln.startswith("RESULT ")]
    rcs = [p.returncode for p in procs]
    # Gloo (also the group of "none") may abort at exit after a complete run, a Gloo bug seen without
    # pycyxwiz too: its result still counts. Our runs must exit cleanly.
    if not lines or (backend == "cyxwiz" and any(rcs)):
        raise RuntimeError(f"{backend} {mode} {arg}: rc={rcs}\n{outs[0][1][-3000:]}\n{outs[-1][1][-3000:]}")
    if any(rcs):
        log(f"{backend} {mode} {arg}: complete, but a rank exited with {rcs} (Gloo's abort at exit)")
    return json.loads(lines[-1][7:])


def params_path(tmp: str, backend: str, arg: str, rank: int, early: bool = False) -> str:
    return os.path.join(tmp, f"{backend}-{arg}-{rank}.npz" + (".early.npz" if early else ""))


def distance(tmp: str, a: str, b: str, arg: str, world: int, early: bool = False) -> tuple:
    """(max |a - b| / max |b| of the worst parameter tensor, rms |a - b| / rms |b| over all parameters), each
    on the worst rank; (0.0, 0.0): the same bits. early: after the 3 warm-up steps, else at the end.
    Differently ordered float32 sums stay at rounding level (max about 1e-6) until one gradient element
    that nearly cancels across the ranks comes out with another sign or size: Adam's g / sqrt(v) turns
    that last-bit difference into a step of up to lr, and the difference then spreads through the model
    and grows, max and rms alike. When that happens first, if within the run, depends on the order: chance."""
    import numpy as np
    worst = worst_rms = 0.0
    for r in range(world):
        num = den = 0.0
        with np.load(params_path(tmp, a, arg, r, early)) as pa, np.load(params_path(tmp, b, arg, r, early)) as pb:
            for k in pb.files:
                x, y = pa[k].astype(np.float64), pb[k].astype(np.float64)
                num += float(np.square(x - y).sum())
                den += float(np.square(y).sum())
                if not np.array_equal(x, y):
                    worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
        worst_rms = max(worst_rms, (num / den) ** 0.5 if den > 0 else 0.0)
    return worst, worst_rms


def median_run(runs: list, key: str) -> float:
    return statistics.median(r[key] for r in runs)


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= (1 << 20) else f"{n >> 10} KiB"


def plot(path: str, rows: list, ar: list, world: int) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        log(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot drawn")
        return False
    colors = {"compute only": "tab:gray", "gloo": "tab:blue", "cyxwiz": "tab:red"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    if rows:
        width = 0.27
        for i, (label, key) in enumerate((("compute only", "compute_ms"), ("gloo", "gloo_ms"), ("cyxwiz", "cyxwiz_ms"))):
            xs = [j + (i - 1) * width for j in range(len(rows))]
            bars = left.bar(xs, [r[key] for r in rows], width, color=colors[label], label=label)
            left.bar_label(bars, fmt="%.3g", fontsize=7)
        left.set_xticks(range(len(rows)))
        left.set_xticklabels([r["model"].replace(" (", "\n(") for r in rows], fontsize=8)
        left.set_yscale("log")
        left.set_ylim(bottom=0.5 * min(min(r["compute_ms"], r["gloo_ms"], r["cyxwiz_ms"]) for r in rows))
        left.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        left.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        left.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        left.set_ylabel("ms per step (slowest rank's median; log scale)")
        left.set_title(f"DDP step, Adam, batch 64 per rank, {world} ranks")
        left.grid(True, axis="y", which="both", alpha=0.3)
        left.legend(fontsize=8)
    else:
        left.set_axis_off()
    if ar:
        xs = [a["bytes"] for a in ar]
        for label, key, color, style in (("gloo (torch.distributed)", "gloo_ms", "tab:blue", "-"),
                                         ("cyxwiz (torch.distributed)", "cyxwiz_torch_ms", "tab:red", "-"),
                                         ("cx.distributed.all_reduce", "cx_ms", "tab:red", ":")):
            right.plot(xs, [a[key] for a in ar], linestyle=style, marker="o", color=color, label=label)
        right.set_xscale("log", base=2)
        right.set_yscale("log")
        right.set_xticks(xs)
        right.set_xticklabels([human(n).replace(" ", "") for n in xs])
        right.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        right.set_xlabel("message size (float32, SUM, in place)")
        right.set_ylabel("ms per call (slowest rank's median)")
        right.set_title(f"all_reduce, {world} ranks, one machine over loopback")
        right.grid(True, which="both", alpha=0.3)
        right.legend(fontsize=8)
    else:
        right.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--models", help="comma-separated, e.g. 784-256-10,784-4096-4096-10,0 (0: the small CNN)")
    ap.add_argument("--steps", help="timed DDP steps per run: N for every model, or MODEL=N,... per model "
                                    "(default per model: 200, 20, 100)")
    ap.add_argument("--repeats", type=int, default=1, help="run everything N times, interleaved; report the median run")
    ap.add_argument("--sizes", help="comma-separated all_reduce sizes in bytes (default 4 KiB..64 MiB)")
    ap.add_argument("--no-allreduce", action="store_true", help="only the DDP models")
    ap.add_argument("--no-ddp", action="store_true", help="only the all_reduce sizes")
    ap.add_argument("--out", help="write OUT.md and OUT.json")
    ap.add_argument("--plot", metavar="PATH.png", help="DDP ms/step and all_reduce time vs size (needs matplotlib)")
    args = ap.parse_args()
    models = ["784-256-10"] if args.quick else ["784-256-10", "784-4096-4096-10", "0"]
    if args.models:
        models = args.models.split(",")
    if args.no_ddp:
        models = []
    sizes = [4096, 1 << 20] if args.quick else [4096, 65536, 1 << 20, 16 << 20, 64 << 20]
    if args.sizes:
        sizes = [int(n) for n in args.sizes.split(",")]
    if args.no_allreduce:
        sizes = []
    steps = dict(DDP_STEPS)
    if args.steps:
        if "=" in args.steps:
            steps.update((m, int(k)) for m, k in (item.split("=") for item in args.steps.split(",")))
        else:
            steps = {m: int(args.steps) for m in models}
    rows, ar = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            n = 10 if args.quick else steps.get(m, 20)
            runs = {b: [] for b in ("none", "gloo", "cyxwiz")}
            # The reference is deterministic: one run. Its time is not reported (it is not DDP's).
            ref = run("ref", "ddp", m, n, args.world_size, tmp, 900)
            dist_ref = {k: (0.0, 0.0) for k in ("gloo", "cyxwiz", "gloo_cyxwiz", "gloo_early", "cyxwiz_early")}
            for _ in range(args.repeats):
                for b in runs:
                    runs[b].append(run(b, "ddp", m, n, args.world_size, tmp, 900))
                for key, (a, b, early) in (("gloo", ("gloo", "ref", False)), ("cyxwiz", ("cyxwiz", "ref", False)),
                                           ("gloo_cyxwiz", ("gloo", "cyxwiz", False)),
                                           ("gloo_early", ("gloo", "ref", True)), ("cyxwiz_early", ("cyxwiz", "ref", True))):
                    d = distance(tmp, a, b, m, args.world_size, early)
                    dist_ref[key] = tuple(max(u, v) for u, v in zip(dist_ref[key], d))
            ms = {b: median_run(v, "step_ms") for b, v in runs.items()}
            cpu = {b: median_run(v, "cpu_ms") for b, v in runs.items()}
            rows.append({"model": MODEL_NAMES.get(m, m), "compute_ms": ms["none"], "gloo_ms": ms["gloo"],
                         "cyxwiz_ms": ms["cyxwiz"], "speedup": ms["gloo"] / ms["cyxwiz"],
                         "best_speedup": ms["gloo"] / ms["none"], "gloo_exposed_ms": ms["gloo"] - ms["none"],
                         "cyxwiz_exposed_ms": ms["cyxwiz"] - ms["none"], "compute_cpu_ms": cpu["none"],
                         "gloo_cpu_ms": cpu["gloo"], "cyxwiz_cpu_ms": cpu["cyxwiz"], "steps": n,
                         "gloo_vs_ref": dist_ref["gloo"][0], "cyxwiz_vs_ref": dist_ref["cyxwiz"][0],
                         "gloo_vs_cyxwiz": dist_ref["gloo_cyxwiz"][0], "gloo_vs_ref_rms": dist_ref["gloo"][1],
                         "cyxwiz_vs_ref_rms": dist_ref["cyxwiz"][1], "gloo_vs_cyxwiz_rms": dist_ref["gloo_cyxwiz"][1],
                         "gloo_vs_ref_early": dist_ref["gloo_early"], "cyxwiz_vs_ref_early": dist_ref["cyxwiz_early"],
                         "ref_moved": ref.get("moved"),
                         "runs": runs})
            print({k: v for k, v in rows[-1].items() if k != "runs"}, flush=True)
        for size in sizes:
            iters = 10 if args.quick else (20 if size >= (16 << 20) else 100)
            g, c = [], []
            for _ in range(args.repeats):
                g.append(run("gloo", "allreduce", str(size), iters, args.world_size, tmp, 900))
                c.append(run("cyxwiz", "allreduce", str(size), iters, args.world_size, tmp, 900))
            gloo, torch_path, cx_path = median_run(g, "torch"), median_run(c, "torch"), median_run(c, "cx")
            ar.append({"bytes": size, "gloo_ms": gloo, "cyxwiz_torch_ms": torch_path, "cx_ms": cx_path,
                       "vs_gloo": gloo / torch_path, "torch_over_cx": torch_path / cx_path})
            print(ar[-1], flush=True)
    md = [f"# PyTorch DDP and all_reduce: backend \"cyxwiz\" vs \"gloo\" ({args.world_size} ranks, one machine, "
          f"{os.cpu_count()} cores, torch {__import__('torch').__version__}"
          + (f", median of {args.repeats} runs" if args.repeats > 1 else "") + ")", ""]
    if rows:
        md += ["| model (DDP, Adam, batch 64 per rank) | compute only ms | gloo ms/step | cyxwiz ms/step | speed-up | "
               "best possible speed-up (gloo / compute only) | gloo exposed comm. ms | cyxwiz exposed comm. ms | "
               "gloo vs float64 ref. (max, end) | cyxwiz vs float64 ref. (max, end) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        md += [f"| {r['model']} | {r['compute_ms']:.2f} | {r['gloo_ms']:.2f} | {r['cyxwiz_ms']:.2f} | {r['speedup']:.2f}x | "
               f"{r['best_speedup']:.2f}x | {r['gloo_exposed_ms']:.2f} | {r['cyxwiz_exposed_ms']:.2f} | "
               f"{r['gloo_vs_ref']:.2e} | {r['cyxwiz_vs_ref']:.2e} |" for r in rows]
        md += ["", "Parameters against a float64 reference (the same training with the gradients averaged in float64: "
               "the ranks' float32 gradients summed in float64, divided by the world size, rounded once to float32), "
               "after the 3 warm-up steps and at the end. max: max |diff| / max |param| of the worst tensor; rms: "
               "rms |diff| / rms |param| over all parameters; both on the worst rank, 0 = the same bits. \"moved\": "
               "how far training moved the reference's parameters (max |p - p0| / max |p0|, worst tensor), the scale.",
               "", "| model | gloo vs ref. after 3 steps, max / rms | cyxwiz vs ref. after 3 steps | steps | "
               "gloo vs ref. at the end | cyxwiz vs ref. at the end | gloo vs cyxwiz at the end | moved |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        pair = lambda d: f"{d[0]:.2e} / {d[1]:.2e}"  # noqa: E731
        md += [f"| {r['model']} | {pair(r['gloo_vs_ref_early'])} | {pair(r['cyxwiz_vs_ref_early'])} | {r['steps'] + 3} | "
               f"{pair((r['gloo_vs_ref'], r['gloo_vs_ref_rms']))} | {pair((r['cyxwiz_vs_ref'], r['cyxwiz_vs_ref_rms']))} | "
               f"{pair((r['gloo_vs_cyxwiz'], r['gloo_vs_cyxwiz_rms']))} | "
               + (f"{r['ref_moved']:.2e} |" if r["ref_moved"] is not None else "- |") for r in rows]
        md += ["", f"Reduction order at {args.world_size} ranks (DDP scales each rank's float32 gradients by 1/world size, "
               "exact at a power of two, then all-reduces with SUM):", ""]
        md += [f"- {b}: {how}" for b, how in REDUCTION_ORDER.items()]
        md += ["", "At 2 ranks every order is the one addition g0 + g1: both backends and the reference end with the "
               "same bits. Beyond, a float32 sum in any order misses the correctly rounded one in the last bit for a "
               "share of the elements, and both backends stay at that level (max about 1e-6) until one gradient "
               "element that nearly cancels across the ranks comes out with another sign or size: Adam's "
               "g / sqrt(v) turns it into a step of up to lr, and the difference then spreads and grows, max and "
               "rms alike. When that happens first, if within the run, depends on the order of the additions: "
               "chance, not a defect of either backend. The distances after the warm-up are the tight comparison."]
        md += ["", "CPU time per step and rank (every thread of the process), ms:", "",
               "| model | compute only | gloo | cyxwiz |", "| --- | --- | --- | --- |"]
        md += [f"| {r['model']} | {r['compute_cpu_ms']:.2f} | {r['gloo_cpu_ms']:.2f} | {r['cyxwiz_cpu_ms']:.2f} |"
               for r in rows]
    if ar:
        md += ["", "| all_reduce float32 | gloo (torch.distributed) ms | cyxwiz (torch.distributed) ms | "
               "cx.distributed.all_reduce ms | cyxwiz vs gloo | torch path / cx path |",
               "| --- | --- | --- | --- | --- | --- |"]
        md += [f"| {a['bytes'] // 1024} KiB | {a['gloo_ms']:.3f} | {a['cyxwiz_torch_ms']:.3f} | {a['cx_ms']:.3f} | "
               f"{a['vs_gloo']:.2f}x | {a['torch_over_cx']:.2f} |" for a in ar]
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"ddp": rows, "allreduce": ar, "world_size": args.world_size, "repeats": args.repeats}, f, indent=1)
    if args.plot and plot(args.plot, rows, ar, args.world_size):
        print(f"Plot: {args.plot}")


if __name__ == "__main__":
    main()
