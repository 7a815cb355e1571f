"""All-reduce across two simulated hosts: the flat TCP ring against the hierarchical all_reduce.

    python benchmarks/simhosts.py                        # 2 hosts x 1 and 2 ranks, 1gbit link, 4 KiB..64 MiB
    python benchmarks/simhosts.py --quick                # smoke run: 2 x 2 ranks, 4 KiB and 1 MiB, 1 repeat
    python benchmarks/simhosts.py --json r.json --md r.md --plot r.png

Two hosts (tests/simhosts.py: each a network, IPC and mount namespace with its own /dev/shm) joined by a
veth pair shaped by tbf on both ends (--rate, "none" for unshaped); H=2 hosts x L ranks, rank r on host
r // L. Per L, two settings run in separate jobs, interleaved over --repeats (the order alternating):
  tcp   CYXWIZ_TRANSPORT=tcp: the flat TCP ring through every rank
  auto  CYXWIZ_TRANSPORT unset: hierarchical ("shm+tcp") when every host has 2 or more ranks, else the ring
"algorithm" in the records comes from get_config().transport: "hierarchical" for shm+tcp, else "flat".

Per size (float32, SUM, in place; the method of allreduce_worker.py): one checked call, 2 warm-up calls,
then n calls each after a barrier (n fills --seconds, within [--min-iters, --max-iters]); a call's time is
the slowest rank's, "seconds" the median over calls, then the median over repeats. Link bytes: each
host's rank of local index 0 reads its veth's tx bytes (/proc/net/dev, its network namespace) around n
calls back to back; both hosts summed, divided by n: frames with their headers, both directions.
Needs root, iproute2 and util-linux; run it on an otherwise idle machine.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from simhost_jobs import load_simhosts, log, rate_bytes_per_s, run_job, tx_bytes  # noqa: E402

RESULT, READY = "SIMHOSTS_RESULT", "SIMHOSTS_READY"
DEFAULT_SIZES = [4096 << (2 * i) for i in range(8)]  # 4 KiB .. 64 MiB by 4x


# ----------------------------------------------------------------- rank side

def worker(args):
    import numpy as np

    import pycyxwiz as cx

    cx.set_num_threads(1)
    D = cx.distributed
    D.init()
    rank, n_ranks = D.get_rank(), D.get_world_size()
    counts = os.environ.get("SIMHOST_LOCAL") == "0"  # this rank reads its host's link counter
    dev = os.environ["SIMHOST_VETH"]
    if rank == 0:
        print(f"{READY} {json.dumps({'transport': D.get_config().transport})}", flush=True)

    def slowest(values):
        a = np.array(values, dtype=np.float64)
        D.all_reduce(a, op=D.ReduceOp.MAX)
        return a

    clock = time.perf_counter
    for nbytes in args.sizes:
        x = np.full(nbytes // 4, rank + 1, np.float32)
        D.all_reduce(x)
        want = n_ranks * (n_ranks + 1) / 2
        if np.any(x != want):
            raise RuntimeError(f"rank {rank}: wrong all_reduce result at {nbytes} bytes")
        x.fill(0)
        warm = []
        for _ in range(2):
            D.barrier()
            t = clock()
            D.all_reduce(x)
            warm.append(clock() - t)
        est = slowest([max(warm)])[0]
        n = int(min(args.max_iters, max(args.min_iters, round(args.seconds / max(est, 1e-9)))))
        times = []
        for _ in range(n):
            D.barrier()
            t = clock()
            D.all_reduce(x)
            times.append(clock() - t)
        times = slowest(times)
        D.barrier()
        before = tx_bytes(dev) if counts else 0
        for _ in range(n):
            D.all_reduce(x)
        D.barrier()  # every byte of the calls has crossed
        sent = np.array([tx_bytes(dev) - before if counts else 0], np.float64)
        D.all_reduce(sent)
        if rank == 0:
            print(f"{RESULT} {json.dumps({'bytes': nbytes, 'iters': n, 'seconds': float(np.median(times)), 'link_bytes_per_call': float(sent[0]) / n})}",
                  flush=True)
    D.finalize()


# ----------------------------------------------------------------- driver

def job(hosts, ranks_per_host, setting, args, port):
    """One job of 2 x `ranks_per_host` ranks over every size: (transport, {bytes: record}) or raises."""
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--sizes", *map(str, args.sizes),
            "--seconds", str(args.seconds), "--min-iters", str(args.min_iters), "--max-iters", str(args.max_iters)]
    out, _ = run_job(hosts, ranks_per_host, argv, port, secret="simhosts-benchmark", timeout=args.job_timeout,
                     what=f"L={ranks_per_host} {setting}", transport=setting)
    lines = out.splitlines()
    ready = [json.loads(ln[len(READY) + 1:]) for ln in lines if ln.startswith(READY + " ")]
    results = [json.loads(ln[len(RESULT) + 1:]) for ln in lines if ln.startswith(RESULT + " ")]
    return ready[0]["transport"], {r["bytes"]: r for r in results}


def human(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def fmt_ms(s):
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def markdown(records, args, machine):
    from allreduce_report import md_table

    rate = rate_bytes_per_s(args.rate)
    out = [f"All-reduce (float32, SUM) across 2 simulated hosts, link {args.rate} (tbf on both veth ends); "
           f"median time per call of the slowest rank (ms), median of {args.repeats} interleaved repeats; "
           f"link: bytes over the veth per call, both directions, frames with headers, as a multiple of the "
           f"size; link bound: the time those bytes take at the rate, half in each direction. "
           f"{machine.get('cpu', '?')}, {machine.get('cpus_usable', '?')} cores, {machine.get('date_utc', '')}, "
           f"git {machine.get('git', '?')}.", ""]
    for L in args.ranks_per_host:
        rows = []
        for s in args.sizes:
            by = {r["setting"]: r for r in records if r["ranks_per_host"] == L and r["bytes"] == s}
            f, h = by.get("tcp"), by.get("auto")
            if not f or not h:
                continue
            # What the link allows: half the bytes each way, at the rate.
            bound = [fmt_ms(r["link_bytes_per_call"] / 2 / rate) if rate else "—" for r in (f, h)]
            rows.append([human(s), fmt_ms(f["seconds"]), fmt_ms(h["seconds"]), f"{f['seconds'] / h['seconds']:.2f}",
                         f"{f['link_bytes_per_call'] / s:.2f}", f"{h['link_bytes_per_call'] / s:.2f}", *bound])
        auto_t = {r["transport"] for r in records if r["ranks_per_host"] == L and r["setting"] == "auto"}
        out += [f"**2 hosts x {L} rank{'s' if L > 1 else ''}** (default: {'/'.join(sorted(auto_t))})", "",
                md_table(["size", "flat ring (tcp) ms", f"default ({'/'.join(sorted(auto_t))}) ms", "flat/default",
                          "link bytes/size, flat", "link bytes/size, default", "link bound flat ms",
                          "link bound default ms"], rows), ""]
    return "\n".join(out)


def plot(records, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for L in args.ranks_per_host:
        for setting, style in (("tcp", "--"), ("auto", "-")):
            rs = sorted((r for r in records if r["ranks_per_host"] == L and r["setting"] == setting), key=lambda r: r["bytes"])
            if not rs:
                continue
            setting_label = "CYXWIZ_TRANSPORT=tcp" if setting == "tcp" else "default"
            label = f"2x{L} {setting_label}: {rs[0]['algorithm']} ({rs[0]['transport']})"
            sizes = [r["bytes"] for r in rs]
            ax.plot(sizes, [r["seconds"] * 1e3 for r in rs], style, marker="o", label=label)
            bx.plot(sizes, [r["bytes"] / r["seconds"] / 1e6 for r in rs], style, marker="o", label=label)
    for a, ylabel in ((ax, "time per call (ms, slowest rank, median)"), (bx, "algorithm bandwidth (MB/s)")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("bytes per rank")
        a.set_ylabel(ylabel)
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    fig.suptitle(f"all_reduce float32 across 2 simulated hosts, link {args.rate}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ranks-per-host", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rate", default="1gbit", help='tbf rate on both ends of the link; "none": unshaped')
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="bytes per rank (multiples of 4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.0, help="timed calls per size fill about this")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--quick", action="store_true", help="2 x 2 ranks, 4 KiB and 1 MiB, 1 repeat")
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--plot")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.ranks_per_host, args.sizes, args.repeats, args.seconds = [2], [4096, 1 << 20], 1, 0.3

    from allreduce import machine_info

    SimHosts, Unavailable = load_simhosts()

    machine = machine_info()
    runs = {}  # (L, setting) -> list of (transport, {bytes: result}) per repeat
    port = 29400
    try:
        with SimHosts(rate=None if args.rate == "none" else args.rate) as hosts:
            for rep in range(args.repeats):
                for L in args.ranks_per_host:
                    order = ["tcp", "auto"] if rep % 2 == 0 else ["auto", "tcp"]
                    for setting in order:
                        port += 1
                        t0 = time.monotonic()
                        transport, res = job(hosts, L, setting, args, port)
                        runs.setdefault((L, setting), []).append((transport, res))
                        log(f"repeat {rep + 1}/{args.repeats} 2x{L} {setting} ({transport}): {time.monotonic() - t0:.0f} s")
    except Unavailable as e:
        log(f"simulated hosts cannot be made here: {e}")
        return 2

    records = []
    for (L, setting), reps in runs.items():
        transports = {t for t, _ in reps}
        if len(transports) != 1:
            raise RuntimeError(f"2x{L} {setting}: the transport changed between repeats: {transports}")
        transport = transports.pop()
        for s in args.sizes:
            per = [res[s] for _, res in reps if s in res]
            records.append({"hosts": 2, "ranks_per_host": L, "transport": transport, "setting": setting,
                            "algorithm": "hierarchical" if transport == "shm+tcp" else "flat", "bytes": s,
                            "seconds": statistics.median(r["seconds"] for r in per),
                            "seconds_per_repeat": [r["seconds"] for r in per],
                            "link_bytes_per_call": statistics.median(r["link_bytes_per_call"] for r in per),
                            "rate": args.rate})
    md = markdown(records, args, machine)
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")
    if args.plot:
        plot(records, args, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
