"""Alpha-beta cost model of pycyxwiz's all-reduce: fit, check, project (docs/scaling.md).

  python benchmarks/scaling_model.py measure-link [--rate 1gbit] [--out PATH]
      two network namespaces joined by a tbf-shaped veth pair, one TCP rank in each; times all_reduce
  python benchmarks/scaling_model.py report [--simhosts PATH] [--plot PNG]
      fits alpha/beta from benchmarks/results/*.json, prints the doc's tables (markdown)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "results")
KiB, MiB = 1024, 1024 * 1024
# Engine constants (cpp/cyxwiz/comm): TCP ring slice and its least step, TCP small-message limit, shm small
# limit and chunk.
SLICE, MIN_STEP, TCP_SMALL, SHM_SMALL, SHM_HALF = 1 * MiB, 64 * KiB, 64 * KiB, 32 * KiB, 256 * KiB
CORES = 2  # the development VM
BUCKETS = [163880, 67125248, 12861440]  # the 20M MLP's DDP buckets, reduction order (train_throughput_2core)
LAYER_BWD_FLOP = [2 * 2 * 64 * 4096 * 10, 2 * 2 * 64 * 4096 * 4096, 2 * 64 * 784 * 4096]  # per bucket, same order

# ---------------------------------------------------------------- measure-link

RANK = r'''
import json, os, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
r = D.get_rank()
a = np.arange(1 << 16, dtype=np.float32) + r
D.all_reduce(a)
ok = bool(np.array_equal(a, 2 * np.arange(1 << 16, dtype=np.float32) + 1))
out = {"rank": r, "transport": D.get_config().transport, "ok": ok, "times": {}}
for s in [int(x) for x in os.environ["SM_SIZES"].split(",")]:
    a = np.zeros(s // 4, np.float32)
    n = 50 if s <= 1 << 20 else 30 if s <= 4 << 20 else 15 if s <= 16 << 20 else 10
    for _ in range(3):
        D.all_reduce(a)
    ts = []
    for _ in range(n):
        D.barrier()
        t = time.perf_counter()
        D.all_reduce(a)
        ts.append(time.perf_counter() - t)
    out["times"][s] = ts
print("TIMES " + json.dumps(out), flush=True)
D.finalize()
'''


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=check)


def measure_link(args):
    tag = f"cxsm{os.getpid() % 100000}"
    ns, veth = [tag + "a", tag + "b"], [tag + "x", tag + "y"]
    x = os.getpid() % 250 + 1
    addr = [f"10.79.{x}.1", f"10.79.{x}.2"]
    sizes = [256, 1024] + [4 * KiB * 4 ** k for k in range(8)]  # 256 B, 1 KiB; 4 KiB .. 64 MiB
    made, procs, rec = [], [], None
    tmp = tempfile.mkdtemp(prefix="cxsm")
    script = os.path.join(tmp, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    try:
        for n in ns:
            sh("ip", "netns", "add", n)
            made.append(n)
        sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        made.append(None)  # the pair, in the root namespace until moved
        for n, v, a in zip(ns, veth, addr):
            sh("ip", "link", "set", v, "netns", n)
            sh("ip", "-n", n, "addr", "add", a + "/24", "dev", v)
            sh("ip", "-n", n, "link", "set", "lo", "up")
            sh("ip", "-n", n, "link", "set", v, "up")
            if args.rate != "none":
                sh("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", v, "root", "tbf", "rate", args.rate,
                   "burst", "256kb", "latency", "50ms")
        load0 = os.getloadavg()
        runs = []
        for rep in range(args.repeats):
            env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR=addr[0], MASTER_PORT=str(29700 + rep),
                       CYXWIZ_TRANSPORT="tcp", DISTRIBUTED_TIMEOUT_MS="60000", SM_SIZES=",".join(map(str, sizes)))
            procs = [subprocess.Popen(["ip", "netns", "exec", ns[r], args.python, script], env=dict(env, RANK=str(r)),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True) for r in range(2)]
            outs = [p.communicate(timeout=600) for p in procs]
            for p, (o, e) in zip(procs, outs):
                if p.returncode != 0:
                    raise RuntimeError(f"rank exited {p.returncode}: {e[-2000:]}")
            ranks = [json.loads(next(l for l in o.splitlines() if l.startswith("TIMES "))[6:]) for o, _ in outs]
            runs.append(ranks)
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)
        qdisc = sh("ip", "netns", "exec", ns[0], "tc", "-s", "qdisc", "show", "dev", veth[0]).stdout
        info = sh(args.python, "-c", "import glob,os,time,pycyxwiz as cx;so=glob.glob(os.path.dirname(cx.__file__)"
                  "+'/_core*.so');print(cx.__version__, time.strftime('%Y-%m-%d %H:%M UTC',"
                  "time.gmtime(os.path.getmtime(so[0]))) if so else '?')").stdout.split()
        rec = {"machine": machine(), "load_start": load0, "load_end": os.getloadavg(), "rate": args.rate,
               "tbf": "burst 256kb latency 50ms", "pycyxwiz": {"version": info[0], "built": " ".join(info[1:])},
               "python": args.python, "transport": [r["transport"] for r in runs[0]],
               "check_ok": all(r["ok"] for rr in runs for r in rr), "qdisc_rank0": qdisc, "results": []}
        for s in sizes:
            # slowest rank per call (calls start together after a barrier), pooled over repeats
            slow = [max(t) for rr in runs for t in zip(*(r["times"][str(s)] for r in rr))]
            per = [median([max(t) for t in zip(*(r["times"][str(s)] for r in rr))]) for rr in runs]
            rec["results"].append({"bytes": s, "calls": len(slow), "median_s": median(slow), "min_s": min(slow),
                                   "per_repeat_median_s": per,
                                   "slowest_per_call_us": [round(t * 1e6, 1) for t in slow]})
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()
        for n in made:
            if n is None:  # deleting either end deletes the pair; gone already if it was moved
                sh("ip", "link", "del", veth[0], check=False)
                continue
            for pid in sh("ip", "netns", "pids", n, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", n, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        left = sh("ip", "netns", "list").stdout
        print("ip netns list after cleanup:", repr(left), file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)
    for r in rec["results"]:
        print(f"{fmt_size(r['bytes']):>8}  {r['median_s'] * 1e6:12.1f} us  ({r['calls']} calls)")
    print("JSON:", args.out)


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": os.uname().release,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def fmt_size(b):
    if b % MiB == 0:
        return f"{b // MiB} MiB"
    if b < KiB:
        return f"{b} B"
    if b < MiB and b % KiB == 0:
        return f"{b // KiB} KiB"
    return f"{b / 1e6:.3g} MB"


# ---------------------------------------------------------------- the model
# Each function returns (alpha count, beta bytes) or a time; a, b = seconds per message, per byte.

def ceil_div(s, k):
    return max(1, -(-int(s) // k))


def engine_slice(p):
    """Ring::allReduce: 1 MiB slices, grown so that a step moves at least 64 KiB (p > 16)."""
    return max(SLICE, p * MIN_STEP)


def ring_terms(p, s, slice_=None):
    """pycyxwiz ring: per slice 2p-3 steps (last reduce-scatter step merged with the first all-gather)."""
    return ceil_div(s, slice_ or engine_slice(p)) * (2 * p - 3), 2 * (p - 1) / p * s


def rd_terms(p, s):
    return math.log2(p), math.log2(p) * s


def tcp_terms(p, s, rd=True):
    """The engine's TCP choice: recursive doubling (pow2 >= 4, <= 64 KiB, if it has partners), gather, ring."""
    if rd and s <= TCP_SMALL and p >= 4 and p & (p - 1) == 0:
        return rd_terms(p, s)
    if s * (p - 1) <= TCP_SMALL:
        return p - 1, (p - 1) * s
    return ring_terms(p, s)


def shm_terms(p, s):
    """Shared-memory all-reduce: one round when small; else 2 rounds per 256 KiB chunk (RS, then AG)."""
    if s <= SHM_SMALL:
        return 1, (p - 1) * s
    return 2 * ceil_div(s, SHM_HALF), 2 * (p - 1) / p * s


def over(p):  # ranks per core beyond one: the time-sharing factor on this 2-core VM (an assumption)
    return max(1.0, p / CORES)


def fit(rows, alpha=None):
    """rows: (alpha count, beta bytes, factor, measured s). Least squares in relative error (linear in
    alpha, beta); with alpha given, beta alone."""
    import numpy as np
    if alpha is not None:
        x = np.array([f * nb / t for na, nb, f, t in rows])
        y = np.array([1 - f * na * alpha / t for na, nb, f, t in rows])
        return alpha, float(x @ y / (x @ x))
    A = np.array([[f * na / t, f * nb / t] for na, nb, f, t in rows])
    (a, b), *_ = np.linalg.lstsq(A, np.ones(len(rows)), rcond=None)
    return float(a), float(b)


def fit_link(lk):
    """The tbf bucket passes small calls at the veth's speed and hides alpha under the shaped transfer
    of big ones, so: alpha (and an unshaped beta) from the calls of <= 4 KiB, then beta at that alpha
    from the calls of >= 64 KiB (16 KiB sits at the bucket's edge). Also the joint fit, for the record."""
    rows = [(*tcp_terms(p, s), 1.0, t) for p, s, t in lk]
    a, b_small = fit([r for r, (_, s, _) in zip(rows, lk) if s <= 4 * KiB])
    _, b = fit([r for r, (_, s, _) in zip(rows, lk) if s >= 64 * KiB], alpha=a)
    return a, b, b_small, fit(rows)


# Multi-host: H hosts x L ranks, one NIC per host. P = dict of fitted parameters.

def t_flat_ring(H, L, s, link_b, P, alpha, slice_=None):
    # each step waits for its slowest hop: between hosts or in one (loopback TCP)
    na, nb = ring_terms(H * L, s, slice_)
    return na * max(alpha, P["a_tcp"]) + nb * max(link_b, P["b_tcp"])


def t_flat_rd(H, L, s, link_b, P, alpha):
    intra, inter = math.log2(L), math.log2(H)  # the first log2(L) rounds stay in the host
    return intra * (P["a_tcp"] + s * P["b_tcp"]) + inter * (alpha + s * max(L * link_b, P["b_tcp"]))


def t_hier(H, L, s, link_b, P, alpha, rd_across=True):
    """As built (rd_across: the counterpart rings have butterfly links, 4, 8, ... hosts). Up to 32 KiB: one local shm all-reduce, then every
    counterpart ring reduces the whole buffer. Above: shm reduce-scatter (a round per 256 KiB window)
    and all-gather (a round per 256 KiB of a part), 2(L-1)/L S per rank, around the rings on S/L."""
    if s <= SHM_SMALL:
        na, nb = shm_terms(L, s)
        local, part = na * P["a_shm"] + nb * P["b_shm"], s
    else:
        local = (ceil_div(s, SHM_HALF) + ceil_div(s / L, SHM_HALF)) * P["a_shm"] + 2 * (L - 1) / L * s * P["b_shm"]
        part = s / L
    ca, cb = tcp_terms(H, part, rd=rd_across)  # L counterpart rings share one NIC: L x link beta
    return local + ca * alpha + cb * max(L * link_b, P["b_tcp"])


ALGS = {"ring": t_flat_ring, "rec. doubling": t_flat_rd, "hierarchical": t_hier}


def ddp_step(compute, phases, comm):
    """comm: one time per bucket (reduction order). Returns (no overlap, overlap) step seconds.
    Overlap (an assumption): buckets all-reduce one after another, each from the moment backward has
    produced it; backward splits across buckets by GEMM FLOPs."""
    fwd, bwd, rest = phases
    done, t = 0.0, 0.0
    for flop, c in zip(LAYER_BWD_FLOP, comm):
        done += flop / sum(LAYER_BWD_FLOP) * bwd
        t = max(t, done) + c
    return compute + sum(comm), compute - bwd + max(bwd, t)


# ---------------------------------------------------------------- report

def load(name):
    with open(os.path.join(RES, name)) as f:
        return json.load(f)


def md(head, rows):
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---:" if i else "---" for i in range(len(head))) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def us(t):
    return f"{t * 1e6:,.1f}" if t < 1e-3 else f"{t * 1e6:,.0f}"


def ms(t):
    return f"{t * 1e3:,.2f}" if t < 0.1 else f"{t * 1e3:,.1f}"


def check_rows(points, terms, a, b):
    rows, errs = [], []
    for p, s, t in points:
        na, nb = terms(p, s)
        m = over(p) * (na * a + nb * b)
        errs.append(m / t - 1)
        rows.append([p, fmt_size(s), us(t), us(m), f"{100 * (m / t - 1):+.0f}%"])
    return rows, errs


def rms(e):
    return 100 * math.sqrt(sum(x * x for x in e) / len(e))


BEGIN, END = "<!-- BEGIN generated -->", "<!-- END generated -->"


def report(args):
    ar = load("allreduce_2core.json")
    with open(args.link if os.path.isabs(args.link) else os.path.join(RES, args.link)) as f:
        link = json.load(f)
    tt, ttcp = load("train_throughput_2core.json"), load("train_throughput_2core_tcp.json")
    pts = {}
    for r in ar["summary"]:
        pts.setdefault(r["backend"], []).append((r["world_size"], r["bytes"], r["median_us"] * 1e-6))
    shm, tcp = pts["pycyxwiz"], pts["pycyxwiz-tcp"]
    lk = [(2, r["bytes"], r["median_s"]) for r in link["results"]]
    P = {}
    P["a_shm"], P["b_shm"] = fit([(*shm_terms(p, s), over(p), t) for p, s, t in shm])
    P["a_tcp"], P["b_tcp"] = fit([(*tcp_terms(p, s), 1.0, t) for p, s, t in tcp if p == 2])
    P["a_link"], P["b_link"], b_small, joint = fit_link(lk)
    out = []
    pr = out.append
    m = ar["machine"]
    pr(f"<!-- generated by: python benchmarks/scaling_model.py report; inputs: allreduce_2core.json ({m['date_utc']}, "
       f"git {m['git']}), {os.path.basename(args.link)} ({link['machine']['date_utc']}), train_throughput_2core*.json, "
       f"scaling_compute_2core.csv" + (f", {args.simhosts}" if args.simhosts else "") + " -->")
    pr("\n### Fitted parameters\n")
    rows = []
    srows, se = check_rows(shm, shm_terms, P["a_shm"], P["b_shm"])
    trows, te = check_rows(tcp, tcp_terms, P["a_tcp"], P["b_tcp"])
    lrows, le = check_rows(lk, tcp_terms, P["a_link"], P["b_link"])
    small = [s <= 4 * KiB for _, s, _ in lk]
    ls, le_small = check_rows([x for x, k in zip(lk, small) if k], tcp_terms, P["a_link"], b_small)
    for r, k, e in zip(lrows, small, le):
        r.append(ls.pop(0)[-1] if k else "")
    le_big = [e for e, (_, s, _) in zip(le, lk) if s >= 64 * KiB]
    _, je = check_rows(lk, tcp_terms, *joint)
    je_big = [e for e, (_, s, _) in zip(je, lk) if s >= 64 * KiB]
    te2 = [e for (p, _, _), e in zip(tcp, te) if p == 2]
    rows.append(["alpha_shm, beta_shm", f"{P['a_shm'] * 1e6:.2f} us", f"{P['b_shm'] * 1e9:.3f} ns/B "
                 f"({1 / P['b_shm'] / 1e9:.1f} GB/s)", "pycyxwiz shm all_reduce, 2 and 4 ranks (allreduce_2core.json)",
                 f"{rms(se):.0f}%"])
    rows.append(["alpha_tcp, beta_tcp", f"{P['a_tcp'] * 1e6:.2f} us", f"{P['b_tcp'] * 1e9:.3f} ns/B "
                 f"({1 / P['b_tcp'] / 1e9:.2f} GB/s)", "pycyxwiz TCP loopback all_reduce, 2 ranks (allreduce_2core.json)",
                 f"{rms(te2):.0f}%"])
    rows.append(["alpha_link, beta_link", f"{P['a_link'] * 1e6:.2f} us", f"{P['b_link'] * 1e9:.3f} ns/B "
                 f"({8 / P['b_link'] / 1e9:.3f} Gbit/s)", f"pycyxwiz TCP all_reduce, 2 ranks, 2 netns, veth + tbf "
                 f"{link['rate']} ({os.path.basename(args.link)}): alpha on <= 4 KiB, beta on >= 64 KiB",
                 f"{rms(le_big):.0f}% (>= 64 KiB)"])
    pr(md(["parameters", "alpha", "beta", "fitted on (2-core AMD EPYC VM)", "rms rel. error"], rows))
    head = ["ranks", "size", "measured us", "model us", "model/measured - 1"]
    pr("\n### Checked against the measured points\n")
    pr("Shared memory (pycyxwiz, `allreduce_2core.json`; 4 ranks on 2 cores: model x 2, oversubscribed):\n")
    pr(md(head, srows))
    pr("\nTCP loopback (pycyxwiz-tcp, `allreduce_2core.json`; fitted on 2 ranks; 4 ranks are a check, model x 2):\n")
    pr(md(head, trows))
    pr(f"\n4-rank TCP points (not in the fit): rms relative error {rms([e for (p, _, _), e in zip(tcp, te) if p == 4]):.0f}%.")
    pr(f"\nLink: two namespaces, veth shaped with tbf rate {link['rate']} ({os.path.basename(args.link)}):\n")
    pr(md(head + [f"with the burst's beta ({b_small * 1e9:.2f} ns/B)"], lrows))
    pr(f"\nThe calls of <= 4 KiB fit alpha_link with a beta of {b_small * 1e9:.3f} ns/B (rms {rms(le_small):.0f}%, last "
       f"column): the tbf burst passes them at the veth's speed, so beta_link does not apply to them. 16 KiB sits "
       f"at the bucket's edge (its median flips between runs) and is in neither fit. One joint fit over all sizes "
       f"would give alpha {joint[0] * 1e6:.1f} us, beta {joint[1] * 1e9:.3f} ns/B, rms {rms(je_big):.0f}% on the "
       f">= 64 KiB points.")
    if args.simhosts:
        pr(simhosts_table(args.simhosts, P, link))
    # projections
    link_rate = {10: 8 / 10e9, 100: 8 / 100e9}
    dc_alpha = args.dc_alpha * 1e-6
    grads = sum(BUCKETS)
    sizes = [(4 * KiB, "4 KiB"), (1 * MiB, "1 MiB"), (25 * MiB, "25 MiB (bucket cap)"), (grads, "80.2 MB (all grads)")]
    pr("\n### Projection (model, not measured): H hosts x 8 ranks, all-reduce time in ms\n")
    pr(f"Alpha across hosts: measured alpha_link = {P['a_link'] * 1e6:.1f} us, or an assumed datacenter "
       f"{args.dc_alpha:.0f} us (not a measurement). Beta across hosts: 8 bits / link rate; the NIC is "
       f"shared by the host's ranks; one TCP stream never goes faster than beta_tcp.\n")
    rows = []
    for H in (16, 64, 256):
        for g in (10, 100):
            for s, name in sizes:
                row = [H, g, name]
                for alpha in (P["a_link"], dc_alpha):
                    ts = {k: f(H, 8, s, link_rate[g], P, alpha) for k, f in ALGS.items()}
                    best = min(ts, key=ts.get)
                    row += [ms(ts[k]) for k in ALGS] + [best]
                rows.append(row)
    pr(md(["hosts", "Gbit/s", "size"] + [f"{k} (a={lab})" for lab in ("meas", f"{args.dc_alpha:.0f}us")
                                          for k in list(ALGS) + ["wins"]], rows))
    rows = []
    for H in (16, 64, 256):
        for g in (10, 100):
            for alpha in (P["a_link"], dc_alpha):
                a = (H, 8, grads, link_rate[g], P, alpha)
                b = (H, 8, 4 * KiB, link_rate[g], P, alpha)
                rows.append([H, g, f"{alpha * 1e6:.0f}", ms(t_flat_ring(*a, slice_=SLICE)), ms(t_flat_ring(*a)),
                             ms(t_flat_ring(*a, slice_=1 << 30)), ms(t_hier(*b, rd_across=False)), ms(t_hier(*b)),
                             ms(t_flat_rd(*b))])
    pr("\nWhat the model said before two changes it led to (model, ms). The ring at 80.2 MB with fixed 1 MiB slices "
       "(each a whole ring of 2p-3 steps; before), with slices grown to p x 64 KiB (as built) and with one slice "
       "(`CYXWIZ_RING_SLICE_BYTES=1073741824`); hierarchical at 4 KiB with counterpart rings without "
       "recursive-doubling links (before) and with them (as built):\n")
    pr(md(["hosts", "Gbit/s", "alpha us", "ring 80.2 MB, 1 MiB slices (before)", "ring 80.2 MB, as built",
           "ring 80.2 MB, one slice", "hier. 4 KiB, no RD across (before)", "hier. 4 KiB, as built",
           "flat RD 4 KiB"], rows))
    pr(sensitivity(shm, tcp, P, link_rate))
    pr(ddp_tables(P, tt, ttcp, link_rate, dc_alpha, args))
    if args.plot:
        plot(args.plot, P, link_rate[10], dc_alpha)
        pr(f"\nPlot: {os.path.relpath(args.plot, os.path.dirname(HERE))}")
    text = "\n".join(out)
    print(text)
    if args.write_doc:  # replace the generated block of docs/scaling.md
        doc = os.path.join(os.path.dirname(HERE), "docs", "scaling.md")
        with open(doc) as f:
            d = f.read()
        a, b = d.index(BEGIN) + len(BEGIN), d.index(END)
        with open(doc, "w") as f:
            f.write(d[:a] + "\n" + text + "\n" + d[b:])


def sensitivity(shm, tcp, P, link_rate):
    """Betas from the >= 4 MiB points only (alphas kept): how much the big-message projections move."""
    Q = dict(P)
    _, Q["b_shm"] = fit([(*shm_terms(p, s), over(p), t) for p, s, t in shm if s >= 4 * MiB], alpha=P["a_shm"])
    _, Q["b_tcp"] = fit([(*tcp_terms(p, s), 1.0, t) for p, s, t in tcp if p == 2 and s >= 4 * MiB], alpha=P["a_tcp"])
    g = sum(BUCKETS)
    cells = []
    for name, f in (("ring (one slice)", lambda *a: t_flat_ring(*a, slice_=1 << 30)), ("hierarchical", t_hier)):
        x, y = (f(64, 8, g, link_rate[100], R, P["a_link"]) for R in (P, Q))
        cells.append(f"{name} {ms(x)} -> {ms(y)} ms")
    return (f"\nSensitivity: the all-size fits under-predict the largest messages (cache effects: mid sizes run "
            f"faster per byte). Refitted on the >= 4 MiB points only, beta_shm {P['b_shm'] * 1e9:.3f} -> "
            f"{Q['b_shm'] * 1e9:.3f} ns/B and beta_tcp {P['b_tcp'] * 1e9:.3f} -> {Q['b_tcp'] * 1e9:.3f} ns/B; at 64 hosts "
            f"x 8, 100 Gbit/s, 80.2 MB: " + ", ".join(cells) + ".")


def compute_times(tt):
    s = {(r["framework"], r["model"], r["mode"]): r["median_s"] for r in tt["summary"]}
    return s[("pycyxwiz", "large", "nocomm")], s[("pycyxwiz", "large", "ddp")]


def phases(compute, path):
    """Forward / backward / rest split of the compute-only step, from train_step.py's measured breakdown."""
    import csv
    ph = {}
    for row in csv.DictReader(open(path)) if os.path.exists(path) else []:
        if (row.get("section") == "breakdown" and row.get("model") == "large" and "pycyxwiz" in row.get("variant", "")
                and row["phase"] != "step (instrumented)"):
            ph[row["phase"]] = float(row["median_ms"])
    tot = sum(ph.values())
    if not tot:
        raise SystemExit("no breakdown: run benchmarks/train_step.py --models large --no-torch --csv "
                         "benchmarks/results/scaling_compute_2core.csv (see docs/scaling.md)")
    fwd = (ph.get("forward", 0) + ph.get("loss", 0)) / tot
    bwd = ph.get("backward", 0) / tot
    return compute * fwd, compute * bwd, compute * (1 - fwd - bwd), ph


def ddp_tables(P, tt, ttcp, link_rate, dc_alpha, args):
    out = []
    c, ddp = compute_times(tt)
    ct, ddpt = compute_times(ttcp)
    fwd, bwd, rest, ph = phases(c, args.compute)
    out.append("\n### DDP step of the 20M-parameter MLP (batch 64 per rank)\n")
    out.append(f"Compute-only step: {ms(c)} ms (pycyxwiz no-comm, 2 ranks, train_throughput_2core.json); split "
               f"forward+loss {ms(fwd)} / backward {ms(bwd)} / rest {ms(rest)} ms from the one-process breakdown "
               f"(scaling_compute_2core.csv: " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()) + " ms).\n")
    rows = []
    for name, comp, meas, terms, a, b in (("shm", c, ddp, shm_terms, P["a_shm"], P["b_shm"]),
                                           ("tcp", ct, ddpt, tcp_terms, P["a_tcp"], P["b_tcp"])):
        comm = [sum(x * y for x, y in zip(terms(2, s), (a, b))) for s in BUCKETS]
        no, ov = ddp_step(comp, (fwd, bwd, rest), comm)
        rows.append([f"2 ranks, {name}", ms(comp), ms(sum(comm)), ms(no), ms(meas), f"{100 * (no / meas - 1):+.0f}%"])
    out.append("Check on this VM (no spare core, so DDP does not overlap: step = compute + comm):\n")
    out.append(md(["run", "compute ms", "model comm ms", "model step ms", "measured DDP ms", "model/measured - 1"], rows))
    rows = []
    for H in (16, 64, 256):
        for g in (10, 100):
            for alpha in (P["a_link"], dc_alpha):
                comm, pick = [], []
                for s in BUCKETS:
                    ts = {k: f(H, 8, s, link_rate[g], P, alpha) for k, f in ALGS.items()}
                    k = min(ts, key=ts.get)
                    comm.append(ts[k])
                    pick.append(k.split()[0][:4])
                no, ov = ddp_step(c, (fwd, bwd, rest), comm)
                rows.append([H, g, f"{alpha * 1e6:.0f}", "/".join(pick), ms(sum(comm)), ms(no), ms(ov),
                             f"{100 * c / ov:.0f}%"])
    out.append("\nProjection (model): fastest algorithm per bucket "
               f"({', '.join(fmt_size(b) for b in BUCKETS)}), compute as on this VM:\n")
    out.append(md(["hosts x 8", "Gbit/s", "alpha us", "algorithm per bucket", "comm ms", "step, no overlap ms",
                   "step, overlap ms", "efficiency (compute / overlap step)"], rows))
    return "\n".join(out)


def simhosts_table(path, P, link):
    with open(path) as f:
        d = json.load(f)
    recs = d if isinstance(d, list) else next(v for v in d.values() if isinstance(v, list) and v
                                              and isinstance(v[0], dict) and "algorithm" in v[0])
    rows = []
    for r in recs:
        H, L, s, t = r["hosts"], r["ranks_per_host"], r["bytes"], r["seconds"]
        b = 8 / rate_bits(r["rate"]) if r.get("rate") else P["b_link"]
        b = P["b_link"] * b / (8 / rate_bits(link["rate"]))  # the fitted link beta, scaled to this run's rate
        if r["algorithm"] == "hierarchical":
            m = t_hier(H, L, s, b, P, P["a_link"])
        elif L == 1:
            m = sum(x * y for x, y in zip(tcp_terms(H, s), (P["a_link"], b)))
        else:  # the flat engine: recursive doubling when small, else the ring
            f = t_flat_rd if s <= TCP_SMALL and (H * L) & (H * L - 1) == 0 else t_flat_ring
            m = f(H, L, s, b, P, P["a_link"])
        rows.append([f"{H} x {L}", f"{r['algorithm']} ({r.get('setting', r['transport'])})", r.get("rate", "?"), fmt_size(s), us(t),
                     us(m), f"{100 * (m / t - 1):+.0f}%"])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(path)))
    return (f"\nSimulated hosts, measured by another benchmark ({os.path.basename(path)}, written {when}: namespaces with "
            "their own /dev/shm, on this VM; no oversubscription factor, the link is the bottleneck at large sizes; "
            "4 ranks share 2 cores):\n\n"
            + md(["hosts x ranks", "algorithm", "rate", "size", "measured us", "model us", "model/measured - 1"], rows))


def rate_bits(r):
    r = str(r).lower().strip()
    for suf, k in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if r.endswith(suf):
            return float(r[: -len(suf)]) * k
    return float(r)


def plot(path, P, link_b, dc_alpha):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = [4 * KiB * 2 ** k for k in range(17)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (k, f), c in zip(ALGS.items(), ("C0", "C1", "C2")):
        ax.plot(sizes, [f(64, 8, s, link_b, P, P["a_link"]) * 1e3 for s in sizes], c, label=f"{k} (alpha_link {P['a_link'] * 1e6:.1f} us, measured)")
        ax.plot(sizes, [f(64, 8, s, link_b, P, dc_alpha) * 1e3 for s in sizes], c + "--",
                label=f"{k} (alpha {dc_alpha * 1e6:.0f} us, assumed)")
    for x, lab in ((25 * MiB, "bucket cap 25 MiB"), (sum(BUCKETS), "20M grads 80.2 MB")):
        ax.axvline(x, color="gray", ls=":", lw=1)
        ax.text(x, 0.02, lab, rotation=90, fontsize=7, color="gray", ha="right", va="bottom",
                transform=ax.get_xaxis_transform())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce time (ms)")
    ax.set_title("PROJECTION: 64 hosts x 8 ranks, 10 Gbit/s (alpha-beta model)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure-link")
    m.add_argument("--rate", default="1gbit", help="tbf rate, or none")
    m.add_argument("--repeats", type=int, default=2)
    m.add_argument("--python", default="/work/wt/s16/.venv/bin/python", help="interpreter with pycyxwiz for the ranks")
    m.add_argument("--out", default=os.path.join(RES, "scaling_link_2core.json"))
    r = sub.add_parser("report")
    r.add_argument("--link", default="scaling_link_2core.json")
    r.add_argument("--simhosts", help="simhosts_2core.json: adds a measured-vs-model table for hierarchical")
    r.add_argument("--compute", default=os.path.join(RES, "scaling_compute_2core.csv"),
                   help="train_step.py --csv output with the large model's breakdown")
    r.add_argument("--dc-alpha", type=float, default=20.0, help="assumed datacenter alpha, us")
    r.add_argument("--plot", default=os.path.join(RES, "scaling_projection.png"))
    r.add_argument("--write-doc", action="store_true", help="also splice the tables into docs/scaling.md")
    args = ap.parse_args()
    if os.geteuid() != 0 and args.cmd == "measure-link":
        sys.exit("measure-link needs root (network namespaces)")
    measure_link(args) if args.cmd == "measure-link" else report(args)


if __name__ == "__main__":
    main()
