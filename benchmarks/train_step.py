#!/usr/bin/env python3
"""Time one MLP training step (forward, loss, backward, Adam step): pycyxwiz vs PyTorch, one thread each.

    python benchmarks/train_step.py                      # both models, default repeats (a few minutes)
    python benchmarks/train_step.py --quick              # smoke run for CI (< 20 s)
    python benchmarks/train_step.py --models small --rounds 9 --steps 300 --csv out.csv --plot out.png
    python benchmarks/train_step.py --profile            # also time the engine's GEMMs alone (where time goes)

Results, method and analysis: benchmarks/README.md.

Models: "small" = 784-256-10 and "large" = 784-4096-4096-10 (Linear/ReLU), batch 64, cross-entropy,
Adam lr 1e-3. Data: synthetic float32 randn(rows, 784) with randint(0, 10) labels; each step draws a
batch by random index (X[idx], no DataLoader). The gather happens OUTSIDE the timed region, for both
frameworks alike, and both see the very same index sequence.

Timing: each variant runs `warmup` untimed steps then `steps` steps timed one by one with
time.perf_counter; that is one round, summarised by its median step. Rounds are interleaved across
variants (ours, torch fused Adam, torch default Adam, ours, ...) so background load hits all alike.
Reported: median of the round medians, and the min..max of the round medians.

ratio = torch time / pycyxwiz time: >= 1.0 means pycyxwiz is at least as fast.
Works without torch (prints the pycyxwiz column only).
"""

import argparse
import csv
import ctypes
import datetime
import gc
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np

import pycyxwiz as cx
from mlp import LR, MODELS, build_cx, torch_mlp  # the MLP every benchmark trains

# Per-model defaults (steps, warmup) for a full run; --steps/--warmup override both models.
DEFAULTS = {"small": (200, 20), "large": (10, 2)}
QUICK = {"small": (30, 5), "large": (2, 1)}
BATCH = 64
CLASSES = 10

V_OURS = "pycyxwiz Adam"
V_FUSED = "torch Adam(fused=True)"
V_DEFAULT = "torch Adam (default)"


# ----------------------------------------------------------------------------------------------
# environment


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def torch_blas_summary(torch):
    """'BLAS_INFO=mkl, CPU capability usage: AVX512' from torch.__config__.show(), if present."""
    try:
        text = torch.__config__.show()
    except Exception:  # pragma: no cover - very old torch
        return "?"
    parts = []
    for token in text.replace("\n", ",").split(","):
        token = token.strip()
        if token.startswith("BLAS_INFO="):
            parts.append(token)
    for line in text.splitlines():
        if "CPU capability usage" in line:
            parts.append(line.strip(" -"))
        if "Math Kernel Library Version" in line:
            parts.append("MKL " + line.split("Version", 1)[1].split("-")[0].strip())
    return ", ".join(parts) or "?"


def import_torch(disabled):
    if disabled:
        return None, "disabled by --no-torch"
    try:
        import torch  # noqa: F401
        import torch.nn.functional  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return None, f"torch not installed ({type(e).__name__}: {e})"
    return torch, None


# ----------------------------------------------------------------------------------------------
# models and steps


def build_torch(torch, sizes, cx_model, fused):
    model = torch_mlp(torch, sizes)
    # Same initial weights as the pycyxwiz model (parameter order matches: W0, b0, W1, b1, ...).
    with torch.no_grad():
        for tp, cp in zip(model.parameters(), cx_model.parameters()):
            tp.copy_(torch.from_numpy(np.asarray(cp)))
    if fused:
        opt = torch.optim.Adam(model.parameters(), lr=LR, fused=True)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=LR)  # as usually written: the per-tensor CPU loop
    return model, opt


def make_cx_step(model, lossfn, opt):
    def step(xb, yb):
        model.zero_grad()
        out = model.forward(xb)
        loss = lossfn.forward(out, yb)
        model.backward(lossfn.backward(out, yb))
        opt.step(model)
        return loss

    def timed(xb, yb, pc=time.perf_counter):
        t0 = pc()
        model.zero_grad()
        t1 = pc()
        out = model.forward(xb)
        t2 = pc()
        lossfn.forward(out, yb)
        g = lossfn.backward(out, yb)
        t3 = pc()
        model.backward(g)
        t4 = pc()
        opt.step(model)
        t5 = pc()
        return {"zero_grad": t1 - t0, "forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3, "opt step": t5 - t4}

    step.timed = timed
    return step


def make_torch_step(torch, model, opt):
    F = torch.nn.functional

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        out = model(xb)
        loss = F.cross_entropy(out, yb)
        loss.backward()
        opt.step()
        return loss

    def timed(xb, yb, pc=time.perf_counter):
        t0 = pc()
        opt.zero_grad(set_to_none=True)
        t1 = pc()
        out = model(xb)
        t2 = pc()
        loss = F.cross_entropy(out, yb)
        t3 = pc()
        loss.backward()  # includes the loss's own backward
        t4 = pc()
        opt.step()
        t5 = pc()
        return {"zero_grad": t1 - t0, "forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3, "opt step": t5 - t4}

    step.timed = timed
    return step


class Batches:
    """The same pseudo-random index sequence for every variant; gathering is done outside the timer."""

    def __init__(self, X, y, seed, torch=None):
        self.X, self.y, self.torch = X, y, torch
        self.rng = np.random.default_rng(seed)

    def next(self, as_torch):
        idx = self.rng.integers(0, len(self.X), BATCH)
        xb, yb = self.X[idx], self.y[idx]  # fresh contiguous float32 / int64 copies
        if as_torch:
            return self.torch.from_numpy(xb), self.torch.from_numpy(yb)  # zero-copy
        return xb, yb


def run_round(step, batches, as_torch, warmup, steps):
    for _ in range(warmup):
        step(*batches.next(as_torch))
    gc.collect()
    gc.disable()
    try:
        times = []
        pc = time.perf_counter
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(steps):
            xb, yb = batches.next(as_torch)
            t0 = pc()
            step(xb, yb)
            times.append(pc() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        gc.enable()
    # CPU time and page faults per step over the round (this includes the batch gather, done alike for all)
    cpu = ((r1.ru_utime - r0.ru_utime) / steps, (r1.ru_stime - r0.ru_stime) / steps,
           (r1.ru_minflt - r0.ru_minflt) / steps)
    return times, cpu


def run_breakdown(step, batches, as_torch, warmup, steps):
    for _ in range(warmup):
        step(*batches.next(as_torch))
    phases = {}
    gc.collect()
    gc.disable()
    try:
        totals = []
        for _ in range(steps):
            xb, yb = batches.next(as_torch)
            t0 = time.perf_counter()
            d = step.timed(xb, yb)
            totals.append(time.perf_counter() - t0)
            for k, v in d.items():
                phases.setdefault(k, []).append(v)
    finally:
        gc.enable()
    out = {k: statistics.median(v) for k, v in phases.items()}
    out["step (instrumented)"] = statistics.median(totals)
    return out


# ----------------------------------------------------------------------------------------------
# profile: the engine's GEMMs alone, through the very OpenBLAS library pycyxwiz calls


def load_engine_sgemm():
    try:
        import scipy_openblas32 as ob
    except ImportError:
        return None
    lib = ctypes.CDLL(os.path.join(ob.get_lib_dir(), ob.get_library(True)), mode=ctypes.RTLD_GLOBAL)
    f = lib.scipy_cblas_sgemm
    c_int, c_float, c_void_p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    # order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc
    f.argtypes = [c_int] * 6 + [c_float, c_void_p, c_int, c_void_p, c_int, c_float, c_void_p, c_int]
    f.restype = None
    return f


def time_call(fn, min_reps, min_seconds):
    for _ in range(2):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 2000:
            break
    return statistics.median(times)


def gemm_ops(sizes, torch):
    """The GEMMs one pycyxwiz step performs (linear.cpp), with the shapes, transposes and beta the engine
    passes, called through the very OpenBLAS library pycyxwiz links; each with torch's equivalent (MKL,
    with out=: no autograd, no allocation). Plus a 'what-if' dW with beta = 0 and zero_grad's memset of dW
    (not in the sums), to weigh replacing the memset with an overwriting GEMM.

    Returns a list of dicts: layer, op, shape, flops, ours, torch (callables or None), whatif (bool)."""
    sgemm = load_engine_sgemm()
    if sgemm is None:
        return []
    ROW, N, T = 101, 111, 112  # CblasRowMajor, CblasNoTrans, CblasTrans
    rng = np.random.default_rng(0)
    ops = []
    keep = []  # keeps the arrays alive for the callables
    p = lambda a: a.ctypes.data  # noqa: E731  (plain ints, read once: a.ctypes.data per call costs ~7 us)
    for li in range(len(sizes) - 1):
        fin, fout = sizes[li], sizes[li + 1]
        x = rng.standard_normal((BATCH, fin), dtype=np.float32)
        w = rng.standard_normal((fout, fin), dtype=np.float32) * 0.01
        g = rng.standard_normal((BATCH, fout), dtype=np.float32) * 0.01
        y, yt = np.zeros((BATCH, fout), np.float32), np.zeros((fout, BATCH), np.float32)
        dw = np.zeros((fout, fin), np.float32)
        dx = np.zeros((BATCH, fin), np.float32)
        keep.append((x, w, g, y, yt, dw, dx))
        tx = tw = tg = tb = ty = tdw = tdx = None
        if torch is not None:
            tx, tw, tg = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g)
            tb = torch.zeros(fout)
            ty, tdw, tdx = torch.empty(BATCH, fout), torch.empty(fout, fin), torch.empty(BATCH, fin)
        layer = f"L{li} {fin}->{fout}"
        flops = 2.0 * BATCH * fin * fout

        def op(name, shape, ours, theirs=None, whatif=False, fl=flops):
            ops.append({"layer": layer, "op": name, "shape": shape, "flops": fl, "ours": ours,
                        "torch": theirs if torch is not None else None, "whatif": whatif})

        px, pw, pg, py, pyt, pdw, pdx = (p(a) for a in (x, w, g, y, yt, dw, dx))
        # forward: y = x W^T + b (rows pre-seeded with the bias, beta = 1)
        op("fwd y=xW^T", f"{BATCH}x{fin} . ({fout}x{fin})^T",
           lambda px=px, pw=pw, py=py, fin=fin, fout=fout: sgemm(ROW, N, T, BATCH, fout, fin, 1.0, px, fin, pw, fin,
                                                                1.0, py, fout),
           lambda tb=tb, tx=tx, tw=tw, ty=ty: torch.addmm(tb, tx, tw.t(), out=ty))
        # backward: dW += g^T x (beta = 1: accumulates into the grads zero_grad cleared)
        op("bwd dW+=g^Tx", f"({BATCH}x{fout})^T . {BATCH}x{fin}",
           lambda pg=pg, px=px, pdw=pdw, fin=fin, fout=fout: sgemm(ROW, T, N, fout, fin, BATCH, 1.0, pg, fout, px, fin,
                                                                  1.0, pdw, fin),
           lambda tg=tg, tx=tx, tdw=tdw: torch.mm(tg.t(), tx, out=tdw))
        if li > 0:  # the first layer's input needs no gradient (input_grad=False; torch: no requires_grad)
            op("bwd dx=gW", f"{BATCH}x{fout} . {fout}x{fin}",
               lambda pg=pg, pw=pw, pdx=pdx, fin=fin, fout=fout: sgemm(ROW, N, N, BATCH, fin, fout, 1.0, pg, fout, pw,
                                                                      fin, 0.0, pdx, fin),
               lambda tg=tg, tw=tw, tdx=tdx: torch.mm(tg, tw, out=tdx))
        # what-if: a dW GEMM that overwrites (beta = 0) instead of zero_grad's memset + accumulate. OpenBLAS
        # scales C by beta in a pass of its own before the product, so compare it with memset + dW+=.
        op("what-if dW=g^Tx beta=0", f"({BATCH}x{fout})^T . {BATCH}x{fin}",
           lambda pg=pg, px=px, pdw=pdw, fin=fin, fout=fout: sgemm(ROW, T, N, fout, fin, BATCH, 1.0, pg, fout, px, fin,
                                                                  0.0, pdw, fin),
           whatif=True)
        op("zero_grad's memset of dW", f"{fout}x{fin}", lambda dw=dw: dw.fill(0.0), whatif=True, fl=0.0)
    gemm_ops.keep = keep
    # Per-call overhead, subtracted from the times above: an empty (M = N = 0) sgemm through ctypes, and a
    # 1x1 torch.mm / addmm with out= (Python dispatch). The engine calls sgemm from C++ with no such cost.
    z = np.zeros(4, np.float32)
    pz = p(z)
    keep.append(z)
    overhead = {"ours": lambda: sgemm(ROW, N, N, 0, 0, 1, 1.0, pz, 1, pz, 1, 0.0, pz, 1)}
    if torch is not None:
        o1, b1 = torch.zeros(1, 1), torch.zeros(1)
        overhead["torch mm"] = lambda: torch.mm(o1, o1, out=o1)
        overhead["torch addmm"] = lambda: torch.addmm(b1, o1, o1.t(), out=o1)
    gemm_ops.overhead = {k: time_call(fn, 2000, 0.05) for k, fn in overhead.items()}
    for o in ops:
        if o["op"].startswith("zero_grad"):
            o["ovh_ours"], o["ovh_torch"] = 0.0, 0.0
        else:
            o["ovh_ours"] = gemm_ops.overhead["ours"]
            o["ovh_torch"] = gemm_ops.overhead.get("torch addmm" if o["op"].startswith("fwd") else "torch mm", 0.0)
    return ops


def profile_model(sizes, cx_step, batches, torch, min_reps, min_seconds):
    """Instrumented pycyxwiz steps interleaved with the engine's GEMMs alone (and torch's), so that the
    attribution compares numbers taken in the same time window. Medians over the repetitions."""
    ops = gemm_ops(sizes, torch)
    phases, ours, theirs = {}, [[] for _ in ops], [[] for _ in ops]
    for _ in range(2):
        cx_step(*batches.next(False))
        for o in ops:
            o["ours"]()
            if o["torch"]:
                o["torch"]()
    start = time.perf_counter()
    n = 0
    pc = time.perf_counter
    while n < min_reps or pc() - start < min_seconds:
        xb, yb = batches.next(False)
        t0 = pc()
        d = cx_step.timed(xb, yb)
        d["step"] = pc() - t0
        for k, v in d.items():
            phases.setdefault(k, []).append(v)
        for i, o in enumerate(ops):  # ours back to back, as in a step; then torch's, as in a torch step
            t0 = pc()
            o["ours"]()
            ours[i].append(pc() - t0)
        for i, o in enumerate(ops):
            if o["torch"]:
                t0 = pc()
                o["torch"]()
                theirs[i].append(pc() - t0)
        n += 1
        if n >= 5000:
            break
    for i, o in enumerate(ops):
        o["ours_s"] = max(statistics.median(ours[i]) - o["ovh_ours"], 1e-9)
        o["torch_s"] = max(statistics.median(theirs[i]) - o["ovh_torch"], 1e-9) if theirs[i] else None
        del o["ours"], o["torch"]
    return {"ops": ops, "phases": {k: statistics.median(v) for k, v in phases.items()}, "reps": n,
            "overhead": dict(gemm_ops.overhead)}


def profile_adam(nparams, torch, min_seconds):
    """torch's fused Adam kernel on one flat tensor of the model's size (no per-tensor or Python overhead
    to speak of): a reference for the memory-bound pycyxwiz opt step."""
    if torch is None:
        return None
    p = torch.nn.Parameter(torch.zeros(nparams))
    p.grad = torch.randn(nparams)
    opt = torch.optim.Adam([p], lr=LR, fused=True)
    return time_call(opt.step, 5, min_seconds)


def copy_bandwidth(nparams, min_seconds):
    """Single-thread numpy copy of nparams float32s, in GB/s counting read + write (8 B/element)."""
    src = np.ones(nparams, np.float32)
    dst = np.empty_like(src)
    t = time_call(lambda: np.copyto(dst, src), 5, min_seconds)
    return 8.0 * nparams / t / 1e9


# ----------------------------------------------------------------------------------------------
# reporting


def ms(s):
    return f"{s * 1e3:.3f}" if s < 0.1 else f"{s * 1e3:.1f}"


def fmt_table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 or i == 1 else str(c).rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def maybe_plot(path, results, models):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(--plot {path}: matplotlib is not installed; no plot written)")
        return
    variants = [v for v in (V_OURS, V_FUSED, V_DEFAULT) if any((m, v) in results for m in models)]
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        names, meds, lo, hi = [], [], [], []
        for v in variants:
            if (m, v) not in results:
                continue
            r = results[(m, v)]
            names.append(v.replace(" ", "\n", 1))
            meds.append(r["median"] * 1e3)
            lo.append((r["median"] - r["min"]) * 1e3)
            hi.append((r["max"] - r["median"]) * 1e3)
        ax.bar(range(len(names)), meds, yerr=[lo, hi], capsize=4, color=["C0", "C1", "C2"][: len(names)])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylabel("ms per training step (median of rounds)")
        ax.set_title(f"{m}: {'-'.join(map(str, MODELS[m]))}, batch {BATCH}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


# ----------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--models", default="small,large", help="comma-separated: small (784-256-10), large (784-4096-4096-10)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per variant (default 7; quick: 2 small, 1 large)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per round (default: small 200, large 10)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps before each round (default: small 20, large 2)")
    ap.add_argument("--rows", type=int, default=None, help="rows of synthetic data (default 8192; quick: 2048)")
    ap.add_argument("--csv", metavar="PATH", help="write all numbers to this CSV file")
    ap.add_argument("--plot", metavar="PNG", help="bar chart (only if matplotlib is installed)")
    ap.add_argument("--quick", action="store_true", help="short smoke run (< 20 s), e.g. for CI")
    ap.add_argument("--no-torch", action="store_true", help="time pycyxwiz only, even if torch is installed")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-phase breakdown")
    ap.add_argument("--profile", action="store_true", help="also time the engine's GEMMs alone (same OpenBLAS, same "
                                                             "calls) vs torch's, and attribute the pycyxwiz step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    rows = args.rows or (2048 if args.quick else 8192)

    torch, why_no_torch = import_torch(args.no_torch)
    cx.set_num_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass

    t_start = time.perf_counter()
    print("MLP training step benchmark: pycyxwiz vs PyTorch (one thread each)")
    print(f"date      {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"machine   {cpu_model()}, nproc {os.cpu_count()}, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}, numpy {np.__version__}; load average {load_average()}")
    info = cx.build_info()
    print(f"pycyxwiz  {cx.__version__}, {info['blas']}, {info['compiler']}, threads {cx.get_num_threads()}")
    if torch is not None:
        print(f"torch     {torch.__version__}, {torch_blas_summary(torch)}, threads {torch.get_num_threads()}")
    else:
        print(f"torch     -- {why_no_torch}; printing the pycyxwiz column only")
    print(f"data      synthetic float32 randn({rows}, 784), randint(0, {CLASSES}) labels, seed {args.seed}; "
          f"batch {BATCH} gathered by random index X[idx] OUTSIDE the timed region (both frameworks, same indices)")
    print("step      zero_grad, forward, cross-entropy, backward, Adam(lr=1e-3) step; ratio = torch / pycyxwiz "
          "(>= 1.0: pycyxwiz at least as fast)")

    rng = np.random.default_rng(args.seed)
    X = rng.standard_normal((rows, 784), dtype=np.float32)
    y = rng.integers(0, CLASSES, rows).astype(np.int64)

    results = {}
    breakdowns = {}
    profiles = {}
    settings = {}
    csv_rows = []
    for mname in models:
        sizes = MODELS[mname]
        steps, warmup = (QUICK if args.quick else DEFAULTS)[mname]
        steps = args.steps or steps
        warmup = args.warmup if args.warmup is not None else warmup
        rounds = args.rounds or ((2 if mname == "small" else 1) if args.quick else 7)
        settings[mname] = (rounds, steps, warmup)

        cm, lossfn, copt = build_cx(cx, sizes, args.seed)
        variants = {V_OURS: (make_cx_step(cm, lossfn, copt), False)}
        if torch is not None:
            torch.manual_seed(args.seed)
            tm_f, topt_f = build_torch(torch, sizes, cm, fused=True)
            tm_d, topt_d = build_torch(torch, sizes, cm, fused=False)
            variants[V_FUSED] = (make_torch_step(torch, tm_f, topt_f), True)
            variants[V_DEFAULT] = (make_torch_step(torch, tm_d, topt_d), True)
            # Same data, same weights: the first batch's loss must agree before anyone trains.
            xb, yb = Batches(X, y, args.seed + 1).next(False)
            l_cx = lossfn.forward(cm.forward(xb), yb)
            with torch.no_grad():
                l_t = torch.nn.functional.cross_entropy(tm_f(torch.from_numpy(xb)), torch.from_numpy(yb)).item()
            print(f"\n[{mname}] same weights, same batch: loss pycyxwiz {l_cx:.6f}, torch {l_t:.6f}, "
                  f"|diff| {abs(l_cx - l_t):.2e}")
        else:
            print()
        nparams = cm.num_parameters()
        print(f"[{mname}] {'-'.join(map(str, sizes))}, {nparams:,} parameters; {rounds} rounds x {steps} timed steps "
              f"(+{warmup} warm-up) per variant", flush=True)

        per_round = {v: [] for v in variants}
        per_round_cpu = {v: [] for v in variants}
        seeds = {v: np.random.SeedSequence([args.seed, 7]) for v in variants}
        batch_streams = {v: Batches(X, y, seeds[v], torch) for v in variants}  # identical index streams
        for r in range(rounds):
            for v, (step, as_torch) in variants.items():
                t, cpu = run_round(step, batch_streams[v], as_torch, warmup, steps)
                per_round[v].append(statistics.median(t))
                per_round_cpu[v].append(cpu)
        for v, meds in per_round.items():
            cpu = per_round_cpu[v]
            results[(mname, v)] = {"median": statistics.median(meds), "min": min(meds), "max": max(meds),
                                   "rounds": meds, "user": statistics.median(c[0] for c in cpu),
                                   "sys": statistics.median(c[1] for c in cpu),
                                   "faults": statistics.median(c[2] for c in cpu)}

        if not args.no_breakdown:
            bsteps = steps if (mname == "small" or args.quick) else max(steps, 5)
            for v, (step, as_torch) in variants.items():
                breakdowns[(mname, v)] = run_breakdown(step, batch_streams[v], as_torch, max(1, warmup // 2), bsteps)

        if args.profile:
            min_s = 0.3 if args.quick else 5.0
            prof = profile_model(sizes, variants[V_OURS][0], batch_streams[V_OURS], torch, 3 if args.quick else 10,
                                 min_s)
            prof.update({"nparams": nparams, "adam_torch_fused": profile_adam(nparams, torch, min_s / 10),
                         "copy_gbps": copy_bandwidth(nparams, min_s / 10)})
            profiles[mname] = prof
        del variants, cm, copt
        gc.collect()

    # ---- main table
    print("\nTime per training step, ms (median of round medians; min..max of round medians). CPU columns: process "
          "user/system time and minor page faults per step, medians over rounds (the batch gather included)")
    header = ["model", "variant", "median ms", "min..max ms", "torch/ours", "cpu user ms", "sys ms", "page faults"]
    trows = []
    for mname in models:
        ours = results[(mname, V_OURS)]["median"]
        label = f"{mname} {'-'.join(map(str, MODELS[mname]))}"
        for v in (V_OURS, V_FUSED, V_DEFAULT):
            if (mname, v) not in results:
                continue
            r = results[(mname, v)]
            ratio = "" if v == V_OURS else f"{r['median'] / ours:.2f}"
            trows.append([label, v, ms(r["median"]), f"{ms(r['min'])}..{ms(r['max'])}", ratio, ms(r["user"]),
                          ms(r["sys"]), f"{r['faults']:.0f}"])
            rounds, steps, warmup = settings[mname]
            csv_rows.append({"section": "step", "model": mname, "variant": v, "phase": "step",
                             "median_ms": r["median"] * 1e3, "min_ms": r["min"] * 1e3, "max_ms": r["max"] * 1e3,
                             "ratio_torch_over_ours": "" if v == V_OURS else r["median"] / ours,
                             "user_ms": r["user"] * 1e3, "sys_ms": r["sys"] * 1e3, "page_faults": r["faults"],
                             "rounds": rounds, "steps": steps, "warmup": warmup})
            label = ""
    print(fmt_table(header, trows))
    if torch is not None:
        print("(primary ratio: torch Adam(fused=True); 'default' is torch.optim.Adam as usually written, "
              "whose CPU path is a per-tensor loop)")
    else:
        print(f"(torch column omitted: {why_no_torch})")

    # ---- breakdown
    if breakdowns:
        print("\nBreakdown, ms (median per phase over one instrumented round; torch's 'loss' is the forward only, "
              "its backward is inside 'backward')")
        phases = ["zero_grad", "forward", "loss", "backward", "opt step", "step (instrumented)"]
        header = ["model", "variant"] + ["loss fwd+bwd" if p == "loss" else p for p in phases]
        brows = []
        for mname in models:
            label = mname
            for v in (V_OURS, V_FUSED, V_DEFAULT):
                if (mname, v) not in breakdowns:
                    continue
                b = breakdowns[(mname, v)]
                brows.append([label, v] + [ms(b[p]) for p in phases])
                for p in phases:
                    csv_rows.append({"section": "breakdown", "model": mname, "variant": v, "phase": p,
                                     "median_ms": b[p] * 1e3})
                label = ""
        print(fmt_table(header, brows))

    # ---- profile
    for mname, prof in profiles.items():
        ph = prof["phases"]
        T = ph["step"]
        ovh = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in prof["overhead"].items())
        print(f"\nProfile [{mname}]: {prof['reps']} instrumented pycyxwiz steps, each followed by the engine's GEMMs "
              f"alone (same OpenBLAS library, same calls as linear.cpp, via ctypes)"
              + (" and torch's (addmm/mm with out=: MKL, no autograd, no allocation)" if torch is not None else "")
              + f"; medians, net of the per-call overhead ({ovh})")
        header = ["layer", "op", "shape", "ours us", "GFLOP/s", "torch us", "GFLOP/s", "torch/ours"]
        prow = []
        sums = {"fwd": 0.0, "bwd": 0.0, "torch": 0.0}
        for o in prof["ops"]:
            os_, ts_ = o["ours_s"], o["torch_s"]
            if not o["whatif"]:
                sums["fwd" if o["op"].startswith("fwd") else "bwd"] += os_
                sums["torch"] += ts_ or 0.0
            gf = lambda t: f"{o['flops'] / t / 1e9:.1f}" if (t and o["flops"]) else "-"  # noqa: E731
            prow.append([o["layer"], o["op"], o["shape"], f"{os_ * 1e6:.1f}", gf(os_),
                         f"{ts_ * 1e6:.1f}" if ts_ else "-", gf(ts_), f"{ts_ / os_:.2f}" if ts_ else "-"])
            csv_rows.append({"section": "profile-gemm", "model": mname, "variant": f"{o['layer']} {o['op']}",
                             "phase": o["shape"], "median_ms": os_ * 1e3,
                             "ratio_torch_over_ours": (ts_ / os_) if ts_ else ""})
        gsum = sums["fwd"] + sums["bwd"]
        prow.append(["all", "sum (no what-ifs)", "", f"{gsum * 1e6:.1f}", "",
                     f"{sums['torch'] * 1e6:.1f}" if sums["torch"] else "-", "",
                     f"{sums['torch'] / gsum:.2f}" if sums["torch"] else "-"])
        print(fmt_table(header, prow))
        adam, zg = ph["opt step"], ph["zero_grad"]
        glue = T - sum(ph[k] for k in ("zero_grad", "forward", "loss", "backward", "opt step"))
        lines = [
            ("forward: GEMMs", sums["fwd"]),
            ("forward: bias seed, ReLU, alloc, binding", ph["forward"] - sums["fwd"]),
            ("loss fwd+bwd (softmax cross-entropy)", ph["loss"]),
            ("backward: GEMMs", sums["bwd"]),
            ("backward: bias grad, ReLU bwd, alloc, binding", ph["backward"] - sums["bwd"]),
            ("opt step (Adam)", adam),
            ("zero_grad (memset of all grads)", zg),
            ("Python between the calls (step - phases)", glue),
        ]
        print(f"Attribution of the pycyxwiz step ({ms(T)} ms median in this window; GEMM rows from the table above):")
        for name, v in lines:
            print(f"  {name:46s} {ms(v):>9} ms  {100 * v / T:5.1f}%")
            csv_rows.append({"section": "profile-attribution", "model": mname, "variant": V_OURS, "phase": name,
                             "median_ms": v * 1e3})
        print(f"  Adam moves 28 B/param (reads p, g, m, v; writes p, m, v): {28.0 * prof['nparams'] / adam / 1e9:.1f} GB/s; "
              f"zero_grad writes 4 B/param: {4.0 * prof['nparams'] / zg / 1e9:.1f} GB/s; "
              f"numpy copy of {prof['nparams']:,} floats: {prof['copy_gbps']:.1f} GB/s (read + write)")
        if prof["adam_torch_fused"]:
            print(f"  torch fused Adam on one flat {prof['nparams']:,}-element tensor: {ms(prof['adam_torch_fused'])} ms")

    print(f"\ntotal wall time {time.perf_counter() - t_start:.1f} s; load average now {load_average()}")

    if args.csv:
        fields = ["section", "model", "variant", "phase", "median_ms", "min_ms", "max_ms", "ratio_torch_over_ours",
                  "user_ms", "sys_ms", "page_faults", "rounds", "steps", "warmup"]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, restval="")
            w.writeheader()
            w.writerows(csv_rows)
        print(f"csv written to {args.csv}")
    if args.plot:
        maybe_plot(args.plot, results, models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
