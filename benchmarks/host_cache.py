#!/usr/bin/env python3
"""The host block cache (docs/engine.md "Host memory") on and off: a Transformer training step's page
faults, system time, step time and peak resident size, each variant in fresh processes.

    python benchmarks/host_cache.py                 # 4 pairs of processes per precision (~3 min)
    python benchmarks/host_cache.py --pairs 8 --steps 60
    python benchmarks/host_cache.py --quick         # smoke run

Model: benchmarks/transformer_step.py's (2 blocks, d_model 128, 4 heads, ff 512, 64 tokens x batch 16,
Adam), one thread; float32 and bfloat16 autocast. The bf16 products go through the widened sgemm
(CYXWIZ_ONEDNN=0 CYXWIZ_MKL=0): the path whose scratch buffers the cache recycles, and the one a CPU
without a bfloat16 kernel library takes. Each process runs --steps steps; reported per variant, over its
processes: the median step time (each process: the median after 5 warm-up steps), minor page faults and
system CPU time per step over the timed steps, and the process's VmHWM. Processes of the two settings
alternate (on, off, on, off, ...), so that load from elsewhere hits both alike: the heap's state differs
from process to process, which is what the cache takes out. Linux only (/proc, getrusage).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

WORKER = r'''
import json, resource, statistics, sys
sys.path.insert(0, sys.argv[1])
import pycyxwiz as cx
import transformer_step as t
from cnn_step import time_ours
precision, steps = sys.argv[2], int(sys.argv[3])
cx.set_num_threads(1)
cx.manual_seed(0)
model, opt = t.cx_model(64), cx.AdamOptimizer(1e-3)
batches = t.data(steps, 16, 64)
before = resource.getrusage(resource.RUSAGE_SELF)
with cx.autocast("bfloat16", enabled=precision == "bf16"):
    times = time_ours(model, opt, batches)
after = resource.getrusage(resource.RUSAGE_SELF)
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
print(json.dumps({"ms": 1e3 * statistics.median(times[5:]), "faults": (after.ru_minflt - before.ru_minflt) / steps,
                  "sys_ms": 1e3 * (after.ru_stime - before.ru_stime) / steps, "hwm": hwm,
                  "stats": cx.host_memory_stats()}))
'''


def one(precision, cache, steps):
    env = dict(os.environ, CYXWIZ_HOST_CACHE=cache, CYXWIZ_ONEDNN="0", CYXWIZ_MKL="0", CYXWIZ_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", WORKER, HERE, precision, str(steps)], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"worker failed ({precision}, CYXWIZ_HOST_CACHE={cache}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=4, help="processes per variant (default 4)")
    p.add_argument("--steps", type=int, default=40, help="steps per process (default 40; the first 5 untimed)")
    p.add_argument("--quick", action="store_true", help="1 pair, 8 steps")
    p.add_argument("--out", default=None, help="also write the report to this file")
    args = p.parse_args()
    if args.quick:
        args.pairs, args.steps = 1, 8
    runs = {(pr, c): [] for pr in ("fp32", "bf16") for c in ("1", "0")}
    for _ in range(args.pairs):
        for pr in ("fp32", "bf16"):
            for c in ("1", "0"):
                runs[(pr, c)].append(one(pr, c, args.steps))
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    span = lambda rs, k: f"{min(r[k] for r in rs):.1f}..{max(r[k] for r in rs):.1f}"  # noqa: E731
    lines = [f"# Host block cache on and off ({datetime.date.today()})", "",
             f"Command: `python benchmarks/host_cache.py --pairs {args.pairs} --steps {args.steps}`  ",
             f"Machine: {cpu}, {os.cpu_count()} cores; one thread; bf16 products through the widened sgemm "
             "(CYXWIZ_ONEDNN=0 CYXWIZ_MKL=0).", "",
             "Medians over the processes (min..max in brackets); faults and system time per step over the timed "
             "steps; VmHWM of the whole process.", "",
             "| precision | cache | step ms | page faults / step | system ms / step | VmHWM MiB | cache misses / step (all steps) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for pr in ("fp32", "bf16"):
        for c in ("1", "0"):
            rs = runs[(pr, c)]
            misses = statistics.median(r["stats"]["misses"] for r in rs)
            lines.append(f"| {pr} | {'on' if c == '1' else 'off'} | {med(rs, 'ms'):.2f} ({span(rs, 'ms')}) | "
                         f"{med(rs, 'faults'):.0f} ({span(rs, 'faults')}) | {med(rs, 'sys_ms'):.2f} | "
                         f"{med(rs, 'hwm'):.0f} | {'-' if c == '0' else f'{misses / args.steps:.1f}'} |")
    ratio = {c: statistics.median(b["ms"] / f["ms"] for b, f in zip(runs[("bf16", c)], runs[("fp32", c)]))
             for c in ("1", "0")}
    lines += ["", f"bf16 / fp32 step time, median over the pairs of processes: cache on {ratio['1']:.3f}, "
              f"off {ratio['0']:.3f}."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
