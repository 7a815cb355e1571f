"""Gradient checkpointing: the training step's peak memory and time, plain against checkpointed, in
pycyxwiz (model.set_gradient_checkpointing) and torch (torch.utils.checkpoint.checkpoint_sequential).

    python benchmarks/gradient_checkpointing.py            # 784-2048x8-10, batch 1024, segments 2,3,4 (~8 min on 2 cores)
    python benchmarks/gradient_checkpointing.py --quick    # smoke run: a small model (~40 s; ~10 s with --no-torch)

The model is one where activations dominate the step: 8 hidden layers of 2048 with ReLU, 10 outputs,
batch 1024, cross-entropy, Adam (lr 1e-3; torch: fused=True, zero_grad(set_to_none=False)), the same
thread count for both frameworks.

Memory: every variant in a fresh process, so its peak resident size (VmHWM) is its own:
  1. build the model and the optimizer, run --warmup steps (the optimizer state exists from then on);
  2. pycyxwiz only: a forward on one row, which shrinks the layers' caches of the last warm-up step
     (a plain pycyxwiz model keeps its activations until the next forward; torch frees its graph in
     backward): both frameworks then start from parameters, gradients and optimizer state alone;
  3. reset VmHWM (/proc/self/clear_refs), read the resident size (the base), run 2 steps;
  4. step peak = VmHWM - base: the memory the step itself needs, which is what checkpointing trades;
     process peak = VmHWM: the whole process, model state included.
  glibc's malloc and pycyxwiz's host block cache keep freed memory resident and reuse it, so with the
  defaults (what a user gets) the step peak carries some noise of where tensors landed. The "live" run
  of each variant sets MALLOC_MMAP_THRESHOLD_=65536 and CYXWIZ_HOST_CACHE=0 (every tensor its own
  mapping, unmapped when freed): the peak of the live tensors alone.
Time: one process per framework runs the variants' steps interleaved (plain, 2, 3, 4, plain, ...) on
one model, so that load from elsewhere on the machine hits all of them alike; each variant's median
step over --rounds rounds (after a warm-up step each), and its median CPU time (user + system).
Linux only (/proc).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mlp import LR, build_cx, torch_mlp  # noqa: E402


def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def make_step(args):
    """(step(segments), settle()) for the framework of args.worker."""
    import numpy as np

    sizes = [784] + [args.hidden] * args.layers + [10]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    if args.worker == "cx":
        import pycyxwiz as cx

        cx.set_num_threads(args.threads)
        model, lossfn, opt = build_cx(cx, sizes, seed=0)

        def step(segments):
            model.set_gradient_checkpointing(segments)
            opt.zero_grad(model)
            model.backward(lossfn.backward(model.forward(X), y))
            opt.step(model)

        return step, lambda: model.forward(X[:1])
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch_mlp(torch, sizes)
    opt = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    xb, yb = torch.from_numpy(X), torch.from_numpy(y)

    def step(segments):
        # Gradients stay allocated between steps, as pycyxwiz's do: set_to_none=True would free 124 MiB of
        # them in every zero_grad and hide the step's activations under their reallocation.
        opt.zero_grad(set_to_none=False)
        if segments > 1:
            out = checkpoint_sequential(model, segments, xb, use_reentrant=False)
        else:
            out = model(xb)
        torch.nn.functional.cross_entropy(out, yb).backward()
        opt.step()

    return step, lambda: None


def memory_worker(args, segments):
    step, settle = make_step(args)
    for _ in range(args.warmup):
        step(segments)
    settle()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = kib("VmRSS")
    for _ in range(2):
        step(segments)
    hwm = kib("VmHWM")
    print(json.dumps({"peak_mib": (hwm - base) / 1024, "process_mib": hwm / 1024}))


def time_worker(args, variants):
    step, _ = make_step(args)
    for seg in variants:
        for _ in range(args.warmup):
            step(seg)
    wall = {seg: [] for seg in variants}
    cpu = {seg: [] for seg in variants}
    for _ in range(args.rounds):
        for seg in variants:
            t, c = time.perf_counter(), time.process_time()
            step(seg)
            wall[seg].append(time.perf_counter() - t)
            cpu[seg].append(time.process_time() - c)
    print(json.dumps({str(seg): {"ms": statistics.median(wall[seg]) * 1e3, "cpu_ms": statistics.median(cpu[seg]) * 1e3}
                      for seg in variants}))


def run_worker(args, framework, what, live=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--what", what,
           "--segments", args.segments, "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--batch", str(args.batch), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
           "--threads", str(args.threads)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", CYXWIZ_HOST_CACHE="0") if live else None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def table(rows, frameworks, segments):
    lines = ["| framework | segments | step peak MiB | x plain | live: step peak MiB | x plain | process peak MiB "
             "| step ms | x plain | CPU ms | x plain |",
             "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |"]
    for fw in frameworks:
        plain = rows[(fw, 0)]
        for seg in segments:
            r = rows[(fw, seg)]
            ratio = {k: r[k] / plain[k] for k in ("peak", "live", "ms", "cpu_ms")}
            lines.append(f"| {fw} | {'plain' if seg == 0 else seg} | {r['peak']:.1f} | {ratio['peak']:.2f} | "
                         f"{r['live']:.1f} | {ratio['live']:.2f} | {r['process']:.0f} | {r['ms']:.0f} | "
                         f"{ratio['ms']:.2f} | {r['cpu_ms']:.0f} | {ratio['cpu_ms']:.2f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segments", default="2,3,4", help="checkpointed variants (default 2,3,4)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8, help="hidden layers")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=7, help="timed steps per variant, interleaved")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="both frameworks (default: every core)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--quick", action="store_true", help="smoke run: 784-256x4-10, batch 128, 3 rounds, no live runs")
    p.add_argument("--markdown", default=None, help="write the result here (default: "
                   "benchmarks/results/gradient_checkpointing.md, not with --quick)")
    p.add_argument("--worker", choices=["cx", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--what", default="time", help=argparse.SUPPRESS)  # "time" or a segment count (memory)
    args = p.parse_args()
    segments = [0] + [int(s) for s in args.segments.split(",")]
    if args.worker:
        return time_worker(args, segments) if args.what == "time" else memory_worker(args, int(args.what))
    if args.quick:
        args.hidden, args.layers, args.batch, args.rounds = 256, 4, 128, 3
    frameworks = ["pycyxwiz"]
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            frameworks.append("torch")
        except ImportError:
            print("torch is not installed: pycyxwiz only (pip install torch==2.13.0 for the comparison)")
    command = " ".join(["python benchmarks/gradient_checkpointing.py", *sys.argv[1:]])
    header = (f"784-{args.hidden}x{args.layers}-10, batch {args.batch}, cross-entropy, Adam, {args.threads} threads "
              f"each; time: {args.rounds} interleaved steps per variant after {args.warmup} warm-up\n"
              f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
              f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the start")
    print(header, flush=True)

    t0 = time.perf_counter()
    rows = {}
    for fw in frameworks:
        worker = "cx" if fw == "pycyxwiz" else "torch"
        for seg in segments:
            mem = run_worker(args, worker, str(seg))
            live = {"peak_mib": float("nan")} if args.quick else run_worker(args, worker, str(seg), live=True)
            rows[(fw, seg)] = {"peak": mem["peak_mib"], "process": mem["process_mib"], "live": live["peak_mib"]}
            print(f"  {fw:8s} segments {seg}: step peak {mem['peak_mib']:.1f} MiB (live {live['peak_mib']:.1f})",
                  flush=True)
        times = run_worker(args, worker, "time")
        for seg in segments:
            rows[(fw, seg)].update(times[str(seg)])
        print(f"  {fw:8s} step ms: " + ", ".join(f"{s}: {times[str(s)]['ms']:.0f}" for s in segments), flush=True)
    text = table(rows, frameworks, segments)
    footer = f"wall time {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.2f} at the end"
    print(f"\n{text}\n\n{footer}")

    path = args.markdown or (None if args.quick else os.path.join(HERE, "results", "gradient_checkpointing.md"))
    if path:
        with open(path, "w") as f:
            f.write(f"# Gradient checkpointing, {os.cpu_count()} cores\n\n`{command}`\n\n```\n{header}\n```\n\n{text}\n\n"
                    f"{footer}.\n\nstep peak: VmHWM over 2 steps minus the resident size before them (parameters, "
                    "gradients and optimizer state allocated, no activations held), the default allocators; live: "
                    "the same with MALLOC_MMAP_THRESHOLD_=65536 and CYXWIZ_HOST_CACHE=0, so that freed tensors "
                    "leave the resident set; "
                    "process peak: VmHWM (default malloc); step ms / CPU ms: medians of the interleaved steps "
                    "(CPU: user + system of the process). x plain: against the same framework's plain step.\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
