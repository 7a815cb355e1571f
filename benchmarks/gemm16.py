"""The CPU GEMMs mixed precision could use, side by side on autocast's shapes: what pycyxwiz does today
(16-bit operands widened exactly to float32, then scipy-openblas32's sgemm) against oneMKL's 16-bit GEMMs
(cblas_gemm_bf16bf16f32, cblas_gemm_f16f16f32: 16-bit A and B, float32 C, AVX512-BF16 / AMX where the
CPU has them) and torch's bfloat16 matmul (oneDNN), all on the same rounded operands.

    pip install mkl                        # oneMKL from PyPI (optional: its columns say "not installed")
    python benchmarks/gemm16.py --out benchmarks/results/gemm16_2core.md
    python benchmarks/gemm16.py --quick    # one small shape

Per shape (m, n, k of a LinearModule's three GEMMs: forward y = x W^T, dW = g^T x, dx = g W) and thread
count: 2 untimed calls, then the best of --repeats calls (time.perf_counter). oneMKL runs its sequential
layer for 1 thread (mkl_set_threading_layer(SEQUENTIAL)) and its GNU OpenMP layer for more; OpenBLAS and
torch are set to the same count. Error: max |C - C64| / max |C64|, C64 the float64 product of the same
16-bit values, so every column multiplies exactly the same numbers and differs only in how it adds them.
"""

import argparse
import ctypes
import glob
import os
import platform
import sys
import time

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(ln for ln in f if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    return ", ".join(f"{name}: {flag in flags}" for name, flag in
                     (("AVX512F", "avx512f"), ("AVX512-BF16", "avx512_bf16"), ("AMX-BF16", "amx_bf16"),
                      ("AVX512-FP16", "avx512_fp16"), ("AMX-FP16", "amx_fp16")))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def bf16_bits(x):
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def load_openblas(threads):
    import scipy_openblas32 as so

    lib = ctypes.CDLL(glob.glob(os.path.join(so.get_lib_dir(), "libscipy_openblas*.so"))[0])
    lib.scipy_openblas_set_num_threads(threads)
    return lib.scipy_cblas_sgemm


def load_mkl(threads):
    """oneMKL's runtime library from the mkl wheel (sys.prefix/lib), or None."""
    paths = glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*"))
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    lib.MKL_Set_Threading_Layer(1 if threads == 1 else 3)  # MKL_THREADING_SEQUENTIAL / MKL_THREADING_GNU
    lib.MKL_Set_Num_Threads(threads)
    return lib


def best_of(fn, repeats):
    fn()
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(shape, threads, repeats, torch):
    m, n, k, ta, tb = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    a16, b16 = bf16_bits(a), bf16_bits(b)
    aw, bw = (a16.astype(np.uint32) << 16).view(np.float32), (b16.astype(np.uint32) << 16).view(np.float32)
    ah, bh = a.astype(np.float16), b.astype(np.float16)
    lda, ldb = a.shape[1], b.shape[1]
    c = np.zeros((m, n), np.float32)
    p = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    f = ctypes.c_float
    opa, opb = (TRANS if ta else NO_TRANS), (TRANS if tb else NO_TRANS)
    ref = (aw.T if ta else aw).astype(np.float64) @ (bw.T if tb else bw).astype(np.float64)
    refh = (ah.T if ta else ah).astype(np.float64) @ (bh.T if tb else bh).astype(np.float64)
    out = {}

    def record(name, fn, want):
        c.fill(0)
        s = best_of(fn, repeats)
        out[name] = (s, float(np.abs(c - want).max() / np.abs(want).max()))

    sgemm = load_openblas(threads)
    record("openblas sgemm (widened bf16)",
           lambda: sgemm(ROW_MAJOR, opa, opb, m, n, k, f(1.0), p(aw), lda, p(bw), ldb, f(0.0), p(c), n), ref)
    mkl = load_mkl(threads)
    if mkl is not None:
        record("oneMKL gemm_bf16bf16f32", lambda: mkl.cblas_gemm_bf16bf16f32(
            ROW_MAJOR, opa, opb, m, n, k, f(1.0), p(a16), lda, p(b16), ldb, f(0.0), p(c), n), ref)
        record("oneMKL gemm_f16f16f32", lambda: mkl.cblas_gemm_f16f16f32(
            ROW_MAJOR, opa, opb, m, n, k, f(1.0), p(ah), lda, p(bh), ldb, f(0.0), p(c), n), refh)
    if torch is not None:
        torch.set_num_threads(threads)
        ta_, tb_ = torch.from_numpy(aw).bfloat16(), torch.from_numpy(bw).bfloat16()
        x, y = (ta_.T if ta else ta_), (tb_.T if tb else tb_)
        res = {}

        def tmm():
            res["c"] = torch.matmul(x, y)

        s = best_of(tmm, repeats)
        got = res["c"].float().numpy()  # bf16 output: rounded, so its error shows the output rounding
        out["torch bf16 matmul (bf16 out)"] = (s, float(np.abs(got - ref).max() / np.abs(ref).max()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    # (m, n, k, A transposed, B transposed): 784-2048x8-10 and 784-4096-4096-10 at batch 1024.
    shapes = {"forward 1024x2048 <- 2048": (1024, 2048, 2048, False, True),
              "dW 2048x2048 <- 1024": (2048, 2048, 1024, True, False),
              "dx 1024x2048 <- 2048": (1024, 2048, 2048, False, False),
              "forward 1024x4096 <- 784": (1024, 4096, 784, False, True),
              "forward 1024x4096 <- 4096": (1024, 4096, 4096, False, True)}
    if args.quick:
        shapes, args.repeats = {"forward 256x512 <- 512": (256, 512, 512, False, True)}, 2
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            pass
    lines = ["# 16-bit GEMMs on the CPU (benchmarks/gemm16.py)", "",
             f"{cpu_name()}, {os.cpu_count()} cores ({cpu_flags()}); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"load average {os.getloadavg()[0]:.2f}; numpy {np.__version__}" + (f", torch {torch.__version__}" if torch else "")
             + ("" if glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")) else "; oneMKL not installed"), "",
             "Best of the timed calls, ms (GFLOP/s); err: max |C - C64| / max |C64| on the same 16-bit operands.", ""]
    for threads in [int(t) for t in args.threads.split(",")]:
        rows = {}
        for name, shape in shapes.items():
            rows[name] = measure(shape, threads, args.repeats, torch)
            print(f"threads {threads} {name}: " + ", ".join(f"{k} {v[0] * 1e3:.2f} ms" for k, v in rows[name].items()),
                  file=sys.stderr, flush=True)
        cols = list(next(iter(rows.values())))
        lines += [f"**{threads} thread{'s' if threads > 1 else ''}**", "",
                  "| GEMM (m x n <- k) | " + " | ".join(cols) + " | x sgemm, best 16-bit |",
                  "| --- | " + " | ".join("--:" for _ in cols) + " | --: |"]
        for name, res in rows.items():
            m, n, k = shapes[name][:3]
            cells = [f"{s * 1e3:.2f} ({2 * m * n * k / s / 1e9:.0f}), err {e:.1e}" for s, e in res.values()]
            base = res[cols[0]][0]
            best = min(v[0] for kk, v in res.items() if kk != cols[0]) if len(res) > 1 else base
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {base / best:.2f} |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
