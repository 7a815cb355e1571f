"""Mixed precision on the CPU: the training step's time and memory in float32, bf16 and fp16, pycyxwiz
(cx.autocast, cx.GradScaler for fp16) beside torch (torch.autocast("cpu", dtype=torch.bfloat16)).

    python benchmarks/mixed_precision.py --out benchmarks/results/mixed_precision_2core.md
                                      # 784-4096-4096-10, batch 64 and 1024 (~5 min on 2 busy cores)
    python benchmarks/mixed_precision.py --quick                # smoke run: 784-512-512-10 (~1 min)

torch runs float32 and bf16 (torch.autocast on the CPU); its fp16 with torch.amp.GradScaler("cpu") only
with --torch-fp16. Each variant (framework x precision x batch) runs in a fresh process, one after the
other, with MALLOC_MMAP_THRESHOLD_=65536 and CYXWIZ_HOST_CACHE=0 (every tensor its own mapping, unmapped
when freed, in both frameworks: the resident size then follows the live tensors, not what malloc or
pycyxwiz's host block cache keeps for reuse):
  1. build the model (seeded) and Adam (lr 1e-3; torch: fused=True, gradients kept between steps as
     pycyxwiz keeps them: zero_grad(set_to_none=False)), run the warm-up steps;
  2. pycyxwiz only: a forward on one row, so that the layers' caches of the last warm-up step shrink
     (a pycyxwiz model keeps its activations until the next forward; torch frees its graph in backward);
  3. reset VmHWM (/proc/self/clear_refs), read the resident size (the base), run --steps steps, timing
     each: step time = the median; step peak = VmHWM - base (the memory the step itself needs: kept
     activations, gradients of activations, temporaries); process peak = VmHWM.
Each thread count of --threads (default "1,<cores>") runs every variant; the same count for both
frameworks. One thread is what each rank of a multi-rank job gets by default; with more, every GEMM
call wakes the BLAS threads, and autocast's blocked GEMMs make many calls (on a busy machine each
wake-up can wait for a time slice).
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

PRECISIONS = ["float32", "bf16", "fp16"]


def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def make_step(framework, precision, sizes, batch, threads):
    """(step(), settle()) for one variant."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch)
    if framework == "cx":
        import pycyxwiz as cx

        cx.set_num_threads(threads)
        model, lossfn, opt = build_cx(cx, sizes, seed=0)
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(precision)
        scaler = cx.GradScaler() if precision == "fp16" else None

        def step():
            opt.zero_grad(model)
            if dtype:
                with cx.autocast(dtype):
                    out = model.forward(X)
            else:
                out = model.forward(X)
            g = lossfn.backward(out, y)
            if scaler:
                model.backward(scaler.scale(g))
                scaler.step(opt, model)
                scaler.update()
            else:
                model.backward(g)
                opt.step(model)

        return step, lambda: model.forward(X[:1])
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_mlp(torch, sizes)
    opt = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    xb, yb = torch.from_numpy(X), torch.from_numpy(y)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(xb)
            loss = torch.nn.functional.cross_entropy(out, yb)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step, lambda: None


def worker(args):
    sizes = json.loads(args.sizes)
    step, settle = make_step(args.worker, args.precision, sizes, args.batch, args.threads)
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
    print(json.dumps({"ms": statistics.median(times) * 1e3, "peak_mib": (hwm - base) / 1024,
                      "process_mib": hwm / 1024, "times_ms": [t * 1e3 for t in times]}))


def counts(args, batch):
    """(warm-up steps, timed steps): fewer above batch 256, where a step takes seconds here."""
    return (args.warmup, args.steps) if batch <= 256 else (max(1, args.warmup // 2), max(2, args.steps // 3))


def run_variant(args, framework, precision, batch, threads):
    warmup, steps = counts(args, batch)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--precision", precision,
           "--batch", str(batch), "--sizes", json.dumps(args.sizes_list), "--threads", str(threads),
           "--warmup", str(warmup), "--steps", str(steps)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", CYXWIZ_HOST_CACHE="0")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def machine():
    cpu = "?"
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    return cpu, "avx512_bf16" in flags, "amx_bf16" in flags, "avx512f" in flags


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="784-512-512-10, batch 64 and 256")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default 64,1024)")
    p.add_argument("--threads", default=f"1,{os.cpu_count()}", help="comma-separated thread counts")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="timed steps at batch <= 256 (a third as many above)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--torch-fp16", action="store_true", help="also torch fp16 autocast + GradScaler")
    p.add_argument("--out", default=None, help="write the markdown table here")
    p.add_argument("--worker", choices=["cx", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--precision", choices=PRECISIONS, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        return worker(args)

    args.sizes_list = [784, 512, 512, 10] if args.quick else [784, 4096, 4096, 10]
    batches = [int(b) for b in (args.batches or ("64,256" if args.quick else "64,1024")).split(",")]
    frameworks = ["cx"]
    if not args.no_torch:
        try:
            import torch

            frameworks.append("torch")
            torch_version = torch.__version__
        except ImportError:
            torch_version = None
    load_before = os.getloadavg()
    start = time.time()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for batch in batches:
            for fw in frameworks:
                for prec in PRECISIONS:
                    if fw == "torch" and prec == "fp16" and not args.torch_fp16:
                        continue
                    res = run_variant(args, fw, prec, batch, threads)
                    rows.append((threads, batch, fw, prec, res))
                    print(threads, batch, fw, prec, json.dumps({k: v for k, v in res.items() if k != "times_ms"}),
                          flush=True)
    load_after = os.getloadavg()
    cpu, bf16_isa, amx, avx512 = machine()

    lines = [f"# Mixed precision on the CPU: step time and memory ({'x'.join(map(str, args.sizes_list))} MLP)", ""]
    lines += [f"Command: `python benchmarks/mixed_precision.py{' --quick' if args.quick else ''}"
              f"{' --out ' + args.out if args.out else ''}`  ",
              f"Machine: {cpu}, {os.cpu_count()} cores (AVX512F: {avx512}, AVX512-BF16: {bf16_isa}, AMX-BF16: {amx}); "
              f"Python {platform.python_version()}; BLAS/torch threads: {args.threads}; "
              f"torch {torch_version if 'torch' in frameworks else 'not run'}  ",
              f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; after: "
              f"{', '.join(f'{x:.2f}' for x in load_after)} (the machine was shared; the run took "
              f"{time.time() - start:.0f} s)  ",
              f"Each variant in a fresh process with MALLOC_MMAP_THRESHOLD_=65536 and CYXWIZ_HOST_CACHE=0: warm-up steps, then the median "
              f"of the timed steps (batch <= 256: {counts(args, 64)[0]} + {counts(args, 64)[1]}; above: "
              f"{counts(args, 1024)[0]} + {counts(args, 1024)[1]}). Step peak = VmHWM during the timed steps minus "
              "the resident size before them (kept activations, their gradients, temporaries); process peak = VmHWM "
              "(parameters, gradients and Adam state included). torch: fused Adam, gradients kept between steps.", "",
              "| threads | batch | framework | precision | step ms | vs float32 | step peak MiB | vs float32 | process peak MiB |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    base = {}
    for threads, batch, fw, prec, res in rows:
        if "error" in res:
            lines.append(f"| {threads} | {batch} | {fw} | {prec} | error: {res['error']} | | | | |")
            continue
        if prec == "float32":
            base[(threads, batch, fw)] = res
        b = base.get((threads, batch, fw))
        rt = f"{res['ms'] / b['ms']:.2f}x" if b else ""
        rm = f"{res['peak_mib'] / b['peak_mib']:.2f}x" if b and b["peak_mib"] > 0 else ""
        name = {"cx": "pycyxwiz", "torch": "torch"}[fw]
        how = {"float32": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast + GradScaler"}[prec]
        lines.append(f"| {threads} | {batch} | {name} | {how} | {res['ms']:.1f} | {rt} | {res['peak_mib']:.1f} | {rm} | "
                     f"{res['process_mib']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
