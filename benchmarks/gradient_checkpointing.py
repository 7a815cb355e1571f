"""Gradient checkpointing: the training step's peak memory and time, plain against checkpointed, in
pycyxwiz (model.set_gradient_checkpointing) and torch (torch.utils.checkpoint.checkpoint_sequential).

    python benchmarks/gradient_checkpointing.py            # 784-2048x8-10, batch 1024, segments 2,3,4 (~6 min on 2 cores)
    python benchmarks/gradient_checkpointing.py --quick    # smoke run: a small model, one round (~15 s)

The model is one where activations dominate the step: 8 hidden layers of 2048 with ReLU, 10 outputs,
batch 1024, cross-entropy, Adam (lr 1e-3), the same thread count for both frameworks. Every variant
runs in a fresh process, so the peak resident size (VmHWM) is its own:

  1. build the model and the optimizer, run --warmup steps (the optimizer state exists from then on);
  2. pycyxwiz only: a forward on one row, which shrinks the layers' caches of the last warm-up step
     (a plain pycyxwiz model keeps its activations until the next forward; torch frees its graph in
     backward): both frameworks then start from parameters, gradients and optimizer state alone;
  3. reset VmHWM (/proc/self/clear_refs), read the resident size (the base), time --steps steps;
  4. "step peak" = VmHWM - base: the memory the step itself needs, which is what checkpointing trades.
     "process peak" = VmHWM: the whole process, model state included.

Rounds run the variants in turn (--rounds, default 3); the table gives each variant's median over
rounds of its median step, and its largest step peak. Linux only (/proc).
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


def worker(args):
    import numpy as np

    sizes = [784] + [args.hidden] * args.layers + [10]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    if args.worker == "cx":
        import pycyxwiz as cx

        cx.set_num_threads(args.threads)
        model, lossfn, opt = build_cx(cx, sizes, seed=0)
        model.set_gradient_checkpointing(args.segments)

        def step():
            opt.zero_grad(model)
            model.backward(lossfn.backward(model.forward(X), y))
            opt.step(model)

        def settle():
            model.forward(X[:1])
    else:
        import torch
        from torch.utils.checkpoint import checkpoint_sequential

        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        model = torch_mlp(torch, sizes)
        opt = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
        xb, yb = torch.from_numpy(X), torch.from_numpy(y)

        def step():
            opt.zero_grad(set_to_none=True)
            if args.segments > 1:
                out = checkpoint_sequential(model, args.segments, xb, use_reentrant=False)
            else:
                out = model(xb)
            torch.nn.functional.cross_entropy(out, yb).backward()
            opt.step()

        def settle():
            pass

    for _ in range(args.warmup):
        step()
    settle()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = kib("VmRSS")
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    hwm = kib("VmHWM")
    print(json.dumps({"base_mib": base / 1024, "peak_mib": (hwm - base) / 1024, "process_mib": hwm / 1024,
                      "step_ms": statistics.median(times) * 1e3}))


def run_variant(args, framework, segments):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--segments", str(segments),
           "--hidden", str(args.hidden), "--layers", str(args.layers), "--batch", str(args.batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def table(rows, frameworks):
    lines = ["| framework | segments | step peak MiB | x plain | process peak MiB | step ms | x plain |",
             "| --- | --: | --: | --: | --: | --: | --: |"]
    for fw in frameworks:
        plain = rows[(fw, 0)]
        for (f, seg), r in rows.items():
            if f != fw:
                continue
            name = "plain" if seg == 0 else str(seg)
            lines.append(f"| {fw} | {name} | {r['peak']:.1f} | {r['peak'] / plain['peak']:.2f} | {r['process']:.0f} | "
                         f"{r['ms']:.0f} | {r['ms'] / plain['ms']:.2f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segments", default="2,3,4", help="checkpointed variants (default 2,3,4)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8, help="hidden layers")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="both frameworks (default: every core)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--quick", action="store_true", help="smoke run: 784-256x4-10, batch 128, one round")
    p.add_argument("--markdown", default=None, help="write the result here (default: "
                   "benchmarks/results/gradient_checkpointing.md, not with --quick)")
    p.add_argument("--worker", choices=["cx", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.segments = int(args.segments)
        return worker(args)
    if args.quick:
        args.hidden, args.layers, args.batch, args.steps, args.rounds = 256, 4, 128, 2, 1
    segments = [0] + [int(s) for s in args.segments.split(",")]
    frameworks = ["pycyxwiz"]
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            frameworks.append("torch")
        except ImportError:
            print("torch is not installed: pycyxwiz only (pip install torch==2.13.0 for the comparison)")
    command = "python benchmarks/gradient_checkpointing.py " + " ".join(sys.argv[1:])
    sizes = f"784-{args.hidden}x{args.layers}-10"
    header = (f"{sizes}, batch {args.batch}, cross-entropy, Adam; {args.steps} timed steps after {args.warmup} "
              f"warm-up, {args.rounds} rounds, {args.threads} threads each\n"
              f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
              f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the start")
    print(header, flush=True)

    results = {}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for fw in frameworks:
            for seg in segments:
                r = run_variant(args, "cx" if fw == "pycyxwiz" else "torch", seg)
                results.setdefault((fw, seg), []).append(r)
                print(f"  round {rnd + 1} {fw:8s} segments {seg}: step peak {r['peak_mib']:.1f} MiB, "
                      f"{r['step_ms']:.0f} ms", flush=True)
    rows = {k: {"peak": max(r["peak_mib"] for r in v), "process": max(r["process_mib"] for r in v),
                "ms": statistics.median(r["step_ms"] for r in v)} for k, v in results.items()}
    text = table(rows, frameworks)
    print("\n" + text)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.2f} at the end")

    path = args.markdown or (None if args.quick else os.path.join(HERE, "results", "gradient_checkpointing.md"))
    if path:
        with open(path, "w") as f:
            f.write(f"# Gradient checkpointing, {os.cpu_count()} cores\n\n`{command}`\n\n{header}\n\n{text}\n\n"
                    "step peak: VmHWM during the timed steps minus the resident size before them (parameters, "
                    "gradients and optimizer state allocated, no activations held); process peak: VmHWM. "
                    "x plain: against the same framework's plain step.\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
