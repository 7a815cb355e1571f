"""All-reduce benchmark: pycyxwiz's TCP ring (cx.distributed) against Gloo (torch.distributed) and
Open MPI over TCP (mpi4py), side by side in one run, on one machine over loopback.

    python benchmarks/allreduce.py                                  # world sizes 2 4, 4 KiB..256 MiB, every library present
    python benchmarks/allreduce.py --quick                          # CI smoke run: 2 ranks, 4 KiB..1 MiB, pycyxwiz only
    python benchmarks/allreduce.py --world-sizes 2 --max-bytes 16777216 --repeats 2 --plot ar.png --json ar.json

Method (as in ../shared/BASELINES.md, "How to measure like the anchors"): float32, SUM, in place, one
process per rank and one thread per rank, the same rank-side code for every library
(benchmarks/allreduce_worker.py). Per size: one checked call, 3 warm-up calls, then n timed calls with a
barrier before each (n fills --seconds, at least 10, at most --max-iters); one call's time is the
slowest rank's; the median over the calls is reported. Then n calls back to back without barriers
(nccl-tests style): total time / n, slowest rank. algbw = bytes / time, busbw = algbw * 2(N-1)/N,
1 GB = 1e9 bytes. The TCP loopback limit is measured in the same run (benchmarks/allreduce_loopback.py).

A library that is missing is skipped with the reason; one that fails or hangs is reported (every run
has a timeout per size, and every process it started is killed) and the others go on.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import allreduce_loopback  # noqa: E402

WORKER = os.path.join(HERE, "allreduce_worker.py")
ALL_BACKENDS = ["pycyxwiz", "gloo", "mpi"]
LABEL = {"pycyxwiz": "pycyxwiz", "gloo": "Gloo", "mpi": "Open MPI"}
MPIRUN_TCP = ["--allow-run-as-root", "--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
              "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
START_TIMEOUT_S = 120.0  # imports (torch) and rendezvous on a busy 2-core machine


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def human(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def busbw(nbytes, us, world):
    if not us or us <= 0:
        return None
    return nbytes / (us * 1e-6) / 1e9 * 2 * (world - 1) / world


# ----------------------------------------------------------------- environment and versions

def run_text(cmd, timeout=90, env=None):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout} s"
    except OSError as e:
        return None, "", str(e)


PROBES = {
    "pycyxwiz": ("import json, pycyxwiz as cx\n"
                 "d = getattr(cx, 'distributed', None)\n"
                 "import glob, os, time\n"
                 "so = sorted(glob.glob(os.path.join(os.path.dirname(cx.__file__), '_core*')))\n"
                 "built = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(os.path.getmtime(so[0]))) if so else None\n"
                 "print(json.dumps({'version': getattr(cx, '__version__', '?'), 'file': cx.__file__, 'built': built,\n"
                 "                  'distributed': d is not None and hasattr(d, 'all_reduce')}))"),
    "torch": ("import json, torch, torch.distributed as d\n"
              "print(json.dumps({'version': torch.__version__,\n"
              "                  'gloo': bool(d.is_available() and d.is_gloo_available())}))"),
    "mpi4py": ("import json, mpi4py\n"
               "mpi4py.rc.initialize = False\n"
               "from mpi4py import MPI\n"
               "lib = MPI.Get_library_version().replace('\\0', '').strip().splitlines()[0]\n"
               "print(json.dumps({'version': mpi4py.__version__, 'library': lib}))"),
}


def probe(name, probes=None):
    """Runs probes[name] (default: this module's PROBES) in a fresh interpreter; its JSON, or why not."""
    rc, out, err = run_text([sys.executable, "-c", (probes or PROBES)[name]])
    if rc == 0:
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    last = (err.strip().splitlines() or ["no output"])[-1]
    return {"error": last}


def machine_info():
    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": "?", "cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        info["cpus_usable"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["mem_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    try:
        info["load_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        info["numpy"] = None
    rc, out, _ = run_text(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], timeout=10)
    if rc == 0:
        info["git"] = out.strip()
    return info


def versions():
    v = {"pycyxwiz": probe("pycyxwiz"), "torch": probe("torch"), "mpi4py": probe("mpi4py")}
    mpirun = shutil.which("mpirun")
    if mpirun:
        rc, out, err = run_text([mpirun, "--version"], timeout=30)
        v["mpirun"] = {"path": mpirun, "version": (out.strip().splitlines() or ["?"])[0]} if rc == 0 else {
            "error": (err.strip() or out.strip() or f"rc {rc}")[-200:]}
    else:
        v["mpirun"] = {"error": "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"}
    v["iperf3"] = allreduce_loopback.iperf3_version()
    return v


def availability(v):
    """backend -> None (usable) or the reason it is not."""
    why = {}
    p = v["pycyxwiz"]
    why["pycyxwiz"] = (f"import pycyxwiz failed: {p['error']}" if "error" in p else
                       None if p.get("distributed") else "this pycyxwiz has no cx.distributed.all_reduce")
    t = v["torch"]
    why["gloo"] = (f"import torch failed: {t['error']} (pip install torch)" if "error" in t else
                   None if t.get("gloo") else "torch.distributed has no Gloo backend")
    m, r = v["mpi4py"], v["mpirun"]
    if "error" in r:
        why["mpi"] = r["error"]
    elif "error" in m:
        why["mpi"] = f"import mpi4py failed: {m['error']} (pip install mpi4py, after Open MPI)"
    else:
        why["mpi"] = None
    return why


# ----------------------------------------------------------------- processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pids):
    """Every live process whose parent chain reaches one of `pids` (read from /proc)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = set(), set(pids)
    while frontier:
        kids = {c for c, p in parent.items() if p in frontier and c not in out}
        out |= kids
        frontier = kids
    return out


def kill_all(procs):
    """SIGKILL the processes we started, their process groups (each is a session leader) and every descendant."""
    live = [p for p in procs if p.poll() is None]
    extra = descendants([p.pid for p in procs]) if live or procs else set()
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in extra:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def size_budget(nbytes, world, seconds, cpus, override=None):
    """Seconds to wait for one size's result before calling it a hang: generous (0.05 GB/s algbw)."""
    if override:
        return override
    oversub = max(1.0, world / max(cpus, 1))
    return 30.0 + 3.0 * seconds + 25 * nbytes / 5e7 * oversub


class Reader:
    """Follows a growing output file line by line."""

    def __init__(self, path):
        self.path, self.pos, self.buf = path, 0, ""

    def lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        self.pos += len(data)
        self.buf += data.decode("utf-8", "replace")
        *done, self.buf = self.buf.split("\n")
        return done


def tagged(line, tag):
    i = line.find(tag + " ")
    if i < 0:
        return None
    try:
        return json.loads(line[i + len(tag) + 1:])
    except ValueError:
        return None


def tail(path, n=6):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip() and "ALLREDUCE_" not in ln]
        return " | ".join(lines[-n:])
    except OSError:
        return ""


def launch_once(backend, world, sizes, args, tmp, cpus):
    """One job: `world` ranks measuring `sizes` in order. Returns (ready, {bytes: result}, failure or None,
    failed_size or None, notes)."""
    port = free_port()
    env = dict(os.environ)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(CYXWIZ_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    wcmd = [sys.executable, "-u", WORKER, "--backend", backend, "--sizes", ",".join(map(str, sizes)),
            "--seconds", str(args.seconds), "--max-iters", str(args.max_iters), "--min-iters", str(args.min_iters),
            "--warmup", str(args.warmup)]
    tag = f"{backend}-{world}-{port}"
    procs, outs, errs = [], [], []
    try:
        if backend == "mpi":
            cmd = [shutil.which("mpirun") or "mpirun"] + MPIRUN_TCP + (["--oversubscribe"] if world > cpus else []) + [
                "-np", str(world)] + wcmd
            outs.append(os.path.join(tmp, f"{tag}.out"))
            errs.append(os.path.join(tmp, f"{tag}.err"))
            with open(outs[0], "wb") as fo, open(errs[0], "wb") as fe:
                procs.append(subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        else:
            for r in range(world):
                e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
                outs.append(os.path.join(tmp, f"{tag}.r{r}.out"))
                errs.append(os.path.join(tmp, f"{tag}.r{r}.err"))
                with open(outs[r], "wb") as fo, open(errs[r], "wb") as fe:
                    procs.append(subprocess.Popen(wcmd, env=e, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                                  start_new_session=True))
        reader = Reader(outs[0])
        ready, results, failure, notes = None, {}, None, []
        idx = 0
        deadline = time.monotonic() + START_TIMEOUT_S + size_budget(sizes[0], world, args.seconds, cpus, args.timeout)
        first_exit = None
        while True:
            for line in reader.lines():
                if (obj := tagged(line, "ALLREDUCE_READY")) is not None:
                    ready = obj
                elif (obj := tagged(line, "ALLREDUCE_RESULT")) is not None and idx < len(sizes):
                    results[obj["bytes"]] = obj
                    progress(backend, world, obj)
                    idx += 1
                    if idx < len(sizes):
                        deadline = time.monotonic() + size_budget(sizes[idx], world, args.seconds, cpus, args.timeout)
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                for line in reader.lines():  # the last lines
                    if (obj := tagged(line, "ALLREDUCE_RESULT")) is not None and obj["bytes"] not in results:
                        results[obj["bytes"]] = obj
                        progress(backend, world, obj)
                        idx += 1
                if any(codes) or idx < len(sizes):
                    failure = f"exit status {codes}"
                break
            if any(c for c in codes if c is not None):
                # A rank failed: give the others a moment to report, then stop them.
                first_exit = first_exit or time.monotonic()
                if time.monotonic() - first_exit > 5:
                    failure = f"rank exited with status {[c for c in codes]} (None: still running, killed)"
                    break
            elif any(c == 0 for c in codes) and idx >= len(sizes):
                first_exit = first_exit or time.monotonic()
                if time.monotonic() - first_exit > 30:
                    notes.append("some ranks did not exit within 30 s of the others (killed)")
                    break
            if time.monotonic() > deadline:
                what = human(sizes[idx]) if idx < len(sizes) else "exit"
                failure = (f"no result for {what} within the time limit "
                           f"({'start-up + ' if ready is None and idx == 0 else ''}"
                           f"{size_budget(sizes[min(idx, len(sizes) - 1)], world, args.seconds, cpus, args.timeout):.0f} s): "
                           "hung or far too slow; killed")
                break
            time.sleep(0.05)
    finally:
        kill_all(procs)
    # Why it failed: the ranks' own error reports first, then the tails of their stderr.
    reports = []
    for path in outs:
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if (obj := tagged(line, "ALLREDUCE_ERROR")) is not None:
                        reports.append(f"rank {obj.get('rank')} at {obj.get('stage')}: {obj.get('error')}")
        except OSError:
            pass
    stderr_tails = [t for t in (tail(p) for p in errs) if t]
    if failure:
        detail = "; ".join(dict.fromkeys(reports)) or (stderr_tails[0] if stderr_tails else "")
        failure = f"{failure}" + (f" -- {detail[:1500]}" if detail else "")
    elif stderr_tails:
        notes.append("stderr: " + stderr_tails[0][:500])
    failed_size = sizes[idx] if failure and idx < len(sizes) else None
    return ready, results, failure, failed_size, notes


def progress(backend, world, r):
    bw = busbw(r["bytes"], r["median_us"], world)
    log(f"  [{LABEL[backend]} x{world}] {human(r['bytes']):>8}: median {r['median_us']:10.1f} us  "
        f"busbw {bw:6.3f} GB/s  back-to-back {busbw(r['bytes'], r['b2b_us'], world):6.3f} GB/s  ({r['iters']} calls)")


def run_backend(backend, world, sizes, args, tmp, cpus):
    """All sizes for one library and world size; a failure at one size is recorded and the job is started
    again for the sizes after it. A failure before the first result stops this library here."""
    t0 = time.monotonic()
    out = {"backend": backend, "world_size": world, "results": {}, "errors": {}, "notes": [], "ready": None}
    todo = list(sizes)
    retried_port = False
    while todo:
        ready, results, failure, failed_size, notes = launch_once(backend, world, todo, args, tmp, cpus)
        out["ready"] = out["ready"] or ready
        out["results"].update(results)
        out["notes"] += notes
        if not failure:
            break
        if not results and ready is None and not retried_port and "in use" in failure.lower():
            retried_port = True  # someone took our port between the check and the bind
            log(f"  [{LABEL[backend]} x{world}] port in use, retrying once: {failure[:200]}")
            continue
        log(f"  [{LABEL[backend]} x{world}] FAILED: {failure[:600]}")
        if failed_size is None:
            out["notes"].append(failure)
            break
        out["errors"][failed_size] = failure
        done = set(out["results"]) | set(out["errors"])
        if ready is None and not results:
            for s in todo:
                out["errors"].setdefault(s, "not run: the job failed before its first result")
            break
        todo = [s for s in todo if s not in done]
    out["wall_s"] = time.monotonic() - t0
    return out


# ----------------------------------------------------------------- tables

def md_table(headers, rows):
    cols = len(headers)
    w = [max(len(str(headers[c])), *(len(str(r[c])) for r in rows)) for c in range(cols)]
    line = lambda cells: "| " + " | ".join(str(v).rjust(w[i]) if i else str(v).ljust(w[i]) for i, v in enumerate(cells)) + " |"  # noqa: E731
    sep = "| " + " | ".join(("-" * (w[i] - 1) + ":") if i else "-" * w[i] for i in range(cols)) + " |"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def fmt_us(v):
    if v is None:
        return "—"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_bw(v):
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}"


def fmt_ratio(v):
    return "—" if v is None else f"{v:.2f}"


def summarize(runs, backends, worlds, sizes):
    """(backend, world, size) -> per-repeat lists and medians."""
    s = {}
    for b in backends:
        for w in worlds:
            for n in sizes:
                reps = [r for r in runs if r["backend"] == b and r["world_size"] == w]
                res = [r["results"][n] for r in reps if n in r["results"]]
                errs = [r["errors"][n] for r in reps if n in r["errors"]]
                e = {"median_us": [x["median_us"] for x in res], "b2b_us": [x["b2b_us"] for x in res],
                     "iters": [x["iters"] for x in res], "errors": errs}
                e["med_us"] = statistics.median(e["median_us"]) if res else None
                e["med_b2b_us"] = statistics.median(e["b2b_us"]) if res else None
                e["busbw"] = busbw(n, e["med_us"], w)
                e["b2b_busbw"] = busbw(n, e["med_b2b_us"], w)
                s[(b, w, n)] = e
    return s


def ratio_list(s, other, w, n):
    """Per repeat: other's time / pycyxwiz's time (= pycyxwiz busbw / other's busbw)."""
    a, b = s[("pycyxwiz", w, n)]["median_us"], s[(other, w, n)]["median_us"]
    return [y / x for x, y in zip(a, b) if x]


def print_tables(s, backends, worlds, sizes, repeats, run_lookup):
    for w in worlds:
        headers = ["size (B)"]
        for b in backends:
            headers += [f"{LABEL[b]} us", f"{LABEL[b]} busbw", f"{LABEL[b]} b2b busbw"]
        others = [b for b in backends if b != "pycyxwiz"] if "pycyxwiz" in backends else []
        headers += [f"pycyxwiz/{LABEL[o]}" for o in others]
        rows = []
        for n in sizes:
            row = [f"{n} ({human(n)})"]
            for b in backends:
                e = s[(b, w, n)]
                if e["med_us"] is None:
                    why = "skipped" if run_lookup.get((b, w)) == "skipped" else ("FAILED" if e["errors"] else "—")
                    row += [why, "—", "—"]
                else:
                    row += [fmt_us(e["med_us"]), fmt_bw(e["busbw"]), fmt_bw(e["b2b_busbw"])]
            for o in others:
                r = ratio_list(s, o, w, n)
                row.append(fmt_ratio(statistics.median(r)) if r else "—")
            rows.append(row)
        print(f"\n### World size {w}" + (f" (median of {repeats} repeats)" if repeats > 1 else "") + "\n")
        print(md_table(headers, rows))
        if repeats > 1:
            headers = ["size (B)"] + [f"{LABEL[b]} busbw min..max" for b in backends] + [
                f"pycyxwiz/{LABEL[o]} min..max" for o in others]
            rows = []
            for n in sizes:
                row = [f"{n} ({human(n)})"]
                for b in backends:
                    bws = [busbw(n, t, w) for t in s[(b, w, n)]["median_us"]]
                    row.append(f"{fmt_bw(min(bws))}..{fmt_bw(max(bws))}" if bws else "—")
                for o in others:
                    r = ratio_list(s, o, w, n)
                    row.append(f"{fmt_ratio(min(r))}..{fmt_ratio(max(r))}" if r else "—")
                rows.append(row)
            print(f"\nSpread over the {repeats} repeats (world size {w}):\n")
            print(md_table(headers, rows))


LEGEND = """Columns: "us" = median time of one call in microseconds (barrier before each call; a call's time is the
slowest rank's); "busbw" = bus bandwidth in GB/s (1e9 B/s) from that median: bytes / time * 2(N-1)/N;
"b2b busbw" = the same from calls back to back without barriers (total time / calls, slowest rank).
"pycyxwiz/X" = X's median time / pycyxwiz's = pycyxwiz busbw / X busbw: above 1, pycyxwiz is faster
(at 4 KiB read it as the ratio of times). "—": not measured; FAILED: see the errors below."""


# ----------------------------------------------------------------- plot

def plot(path, s, backends, worlds, sizes, loop):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot drawn")
        return False
    colors = {"pycyxwiz": "tab:red", "gloo": "tab:blue", "mpi": "tab:green"}
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D"]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for b in backends:
        for i, w in enumerate(worlds):
            xs = [n for n in sizes if s[(b, w, n)]["busbw"] is not None]
            if xs:
                ax.plot(xs, [s[(b, w, n)]["busbw"] for n in xs], linestyle=styles[i % 4], marker=markers[i % 4],
                        color=colors.get(b), label=f"{LABEL[b]}, {w} ranks")
    if loop.get("one_stream_GBps"):
        ax.axhline(loop["one_stream_GBps"], color="gray", linestyle="-", linewidth=1,
                   label=f"TCP loopback, one stream ({loop['one_stream_GBps']:.2f} GB/s)")
    if loop.get("both_ways_per_direction_GBps"):
        ax.axhline(loop["both_ways_per_direction_GBps"], color="gray", linestyle="--", linewidth=1,
                   label=f"TCP loopback, both ways, per direction ({loop['both_ways_per_direction_GBps']:.2f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(n).replace(" ", "") for n in sizes])
    ax.set_xlabel("message size (float32, SUM, in place)")
    ax.set_ylabel("busbw, GB/s (median call, barrier before each)")
    ax.set_title("All-reduce bus bandwidth on one machine over TCP loopback")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", type=int, nargs="+", default=None, help="default 2 4 (--quick: 2)")
    p.add_argument("--min-bytes", type=int, default=4096, help="smallest size (default 4096); sizes go up by x4")
    p.add_argument("--max-bytes", type=int, default=None, help="largest size (default 268435456; --quick: 1048576)")
    p.add_argument("--backends", nargs="+", choices=ALL_BACKENDS, default=None,
                   help="default: all (those not installed are skipped); --quick: pycyxwiz")
    p.add_argument("--seconds", type=float, default=None,
                   help="time to fill per size with timed calls, in each of the two modes (default 2; --quick: 0.2)")
    p.add_argument("--repeats", type=int, default=1, help="run everything this many times, interleaved (default 1)")
    p.add_argument("--quick", action="store_true", help="CI smoke run (< 30 s on 2 cores)")
    p.add_argument("--plot", metavar="PATH.png", help="busbw vs size (needs matplotlib)")
    p.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    p.add_argument("--max-iters", type=int, default=2000, help="cap on timed calls per size and mode (default 2000)")
    p.add_argument("--min-iters", type=int, default=10, help="least timed calls per size and mode (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per size (default 3)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for one size's result before killing the job (default: from the size)")
    p.add_argument("--no-loopback", action="store_true", help="skip the TCP loopback measurement")
    a = p.parse_args(argv)
    a.world_sizes = a.world_sizes or ([2] if a.quick else [2, 4])
    a.max_bytes = a.max_bytes or ((1 << 20) if a.quick else (256 << 20))
    a.seconds = a.seconds if a.seconds is not None else (0.2 if a.quick else 2.0)
    a.backends_given = a.backends is not None
    a.backends = list(dict.fromkeys(a.backends or (["pycyxwiz"] if a.quick else ALL_BACKENDS)))
    if a.min_bytes < 4 or a.min_bytes % 4 or a.max_bytes < a.min_bytes:
        p.error("--min-bytes must be a positive multiple of 4 and at most --max-bytes")
    if any(w < 2 for w in a.world_sizes):
        p.error("--world-sizes: at least 2 ranks")
    a.sizes = []
    n = a.min_bytes
    while n <= a.max_bytes:
        a.sizes.append(n)
        n *= 4
    return a


def main(argv=None):
    args = parse_args(argv)
    t_start = time.monotonic()
    mach = machine_info()
    log("probing the libraries ...")
    ver = versions()
    why = availability(ver)
    cpus = mach.get("cpus_usable") or mach.get("cpus") or 1

    print("# All-reduce benchmark (benchmarks/allreduce.py)\n")
    print("```")
    print(f"date      {mach['date_utc']}")
    print(f"machine   {mach['cpu']}, {mach['cpus']} CPUs ({cpus} usable), {mach.get('mem_gib', '?')} GiB, "
          f"Linux {mach['kernel']}, Python {mach['python']}, numpy {mach.get('numpy')}; "
          f"load average {' '.join(map(str, mach.get('load_start', [])))}")
    p = ver["pycyxwiz"]
    knobs = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("CYXWIZ_") and k != "CYXWIZ_NUM_THREADS")
    print(f"pycyxwiz  {p.get('version', p.get('error'))}" + (f", installed module built {p['built']}" if p.get("built") else "")
          + (f"; source tree at git {mach['git']}" if mach.get("git") else "") + (f"; {knobs}" if knobs else ""))
    t = ver["torch"]
    print(f"torch     {t.get('version', t.get('error'))}" + (f", Gloo {'available' if t.get('gloo') else 'missing'}" if "version" in t else ""))
    print(f"Open MPI  {ver['mpirun'].get('version', ver['mpirun'].get('error'))}")
    m = ver["mpi4py"]
    print(f"mpi4py    {m.get('version', m.get('error'))}" + (f" ({m['library']})" if m.get("library") else ""))
    print(f"iperf3    {ver['iperf3'] or 'not installed'}")
    print(f"method    float32, SUM, in place; one process and one thread per rank; per size: 1 checked call, "
          f"{args.warmup} warm-up, then n calls with a barrier before each (n fills {args.seconds:g} s, "
          f"{args.min_iters}..{args.max_iters}) and n back to back; time = slowest rank; median over calls")
    print(f"sizes     {', '.join(human(n) for n in args.sizes)}; world sizes {' '.join(map(str, args.world_sizes))}; "
          f"repeats {args.repeats}")
    print("gloo      torch.distributed backend 'gloo', init_method env://, GLOO_SOCKET_IFNAME=lo")
    print(f"mpi       mpirun {' '.join(MPIRUN_TCP)} [--oversubscribe when ranks > {cpus}] -np N; "
          "comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)")
    print("```")

    backends = []
    skipped = {}
    for b in args.backends:
        if why[b]:
            skipped[b] = why[b]
        else:
            backends.append(b)
    not_requested = [b for b in ALL_BACKENDS if b not in args.backends]
    if skipped or not_requested:
        print()
        for b, reason in skipped.items():
            print(f"- skipped {LABEL[b]}: {reason}")
        if not_requested:
            print(f"- not requested: {', '.join(LABEL[b] for b in not_requested)}"
                  + (" (--quick measures pycyxwiz only; add --backends pycyxwiz gloo mpi)" if args.quick and not args.backends_given else ""))
    if "mpi" in backends and "Open MPI" not in ver["mpi4py"].get("library", "Open MPI"):
        print(f"- note: mpi4py is built against {ver['mpi4py'].get('library')}, not Open MPI")

    loop = {}
    if args.no_loopback:
        print("\nTCP loopback: not measured (--no-loopback)")
    else:
        log("measuring the TCP loopback limit ...")
        loop = allreduce_loopback.measure_all(quick=args.quick, log=log)
        print("\n## TCP loopback limit (127.0.0.1, measured in this run)\n")
        rows = []

        def cell(entry, key="GBps"):
            if "skipped" in entry:
                return "skipped: " + entry["skipped"]
            if "error" in entry:
                return "error: " + entry["error"][:150]
            if key == "both":
                d = entry["per_direction_GBps"]
                return f"{entry['total_GBps']:.2f} in total ({d[0]:.2f} + {d[1]:.2f})"
            return f"{entry[key]:.2f}"

        secs = 1 if args.quick else 2
        tot = "256 MiB" if args.quick else "1 GiB"
        rows.append([f"iperf3 -c 127.0.0.1 -t {secs}, one stream", cell(loop["iperf3_one_stream"])])
        rows.append([f"iperf3 --bidir -t {secs}, one stream each way (one process per end)", cell(loop["iperf3_bidir"], "both")])
        rows.append([f"Python sockets, one stream, {tot} in 4 MiB sendall()", cell(loop["python_one_stream"])])
        rows.append([f"Python sockets, two processes sending {tot} to each other at once", cell(loop["python_both_ways"], "both")])
        print(md_table(["measurement", "GB/s"], rows))
        one = [e["GBps"] for e in (loop["iperf3_one_stream"], loop["python_one_stream"]) if "GBps" in e]
        if one:
            loop["one_stream_GBps"] = max(one)
        if loop.get("one_stream_GBps") or loop.get("both_ways_per_direction_GBps"):
            print(f"\nLimit used below: one stream {fmt_bw(loop.get('one_stream_GBps'))} GB/s (best of the one-stream rows); "
                  f"both ways at once {fmt_bw(loop.get('both_ways_per_direction_GBps'))} GB/s per direction "
                  "(a ring rank sends and receives at once, so this is the busbw ceiling of a 2-rank ring over loopback).")

    runs = []
    run_lookup = {(b, w): "skipped" for b in skipped for w in args.world_sizes}
    tmp = tempfile.mkdtemp(prefix="allreduce_bench_")
    try:
        for rep in range(args.repeats):
            for w in args.world_sizes:
                for b in backends:
                    log(f"{LABEL[b]}, {w} ranks" + (f", repeat {rep + 1}/{args.repeats}" if args.repeats > 1 else "")
                        + f" ({len(args.sizes)} sizes) ...")
                    r = run_backend(b, w, args.sizes, args, tmp, cpus)
                    r["repeat"] = rep
                    runs.append(r)
                    run_lookup[(b, w)] = "ran"
                    log(f"  done in {r['wall_s']:.1f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    table_backends = backends + [b for b in skipped]
    s = summarize(runs, table_backends, args.world_sizes, args.sizes)
    print("\n## All-reduce, float32 SUM in place: median time and bus bandwidth\n")
    print(LEGEND)
    print_tables(s, table_backends, args.world_sizes, args.sizes, args.repeats, run_lookup)

    problems = []
    for r in runs:
        tagr = f"{LABEL[r['backend']]}, {r['world_size']} ranks" + (f", repeat {r['repeat'] + 1}" if args.repeats > 1 else "")
        for n, e in sorted(r["errors"].items()):
            problems.append(f"- {tagr}, {human(n)}: {e}")
        for note in r["notes"]:
            problems.append(f"- {tagr}: {note[:800]}")
    if problems:
        print("\n## Errors and notes\n")
        print("\n".join(problems))

    try:
        mach["load_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    wall = time.monotonic() - t_start
    print(f"\nTotal wall time {wall:.1f} s; load average at the end {' '.join(map(str, mach.get('load_end', [])))}")

    if args.plot:
        if plot(args.plot, s, backends, args.world_sizes, args.sizes, loop):
            print(f"Plot: {args.plot}")
    if args.json:
        doc = {"machine": mach, "versions": ver, "skipped": skipped, "loopback": loop,
               "config": {k: v for k, v in vars(args).items()}, "wall_s": wall,
               "runs": [dict(r, results=list(r["results"].values()),
                             errors={str(k): v for k, v in r["errors"].items()}) for r in runs],
               "summary": [{"backend": b, "world_size": w, "bytes": n, "median_us": e["med_us"],
                            "b2b_us": e["med_b2b_us"], "busbw_GBps": e["busbw"], "b2b_busbw_GBps": e["b2b_busbw"],
                            "per_repeat_median_us": e["median_us"], "per_repeat_b2b_us": e["b2b_us"],
                            "errors": e["errors"]} for (b, w, n), e in s.items()]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"JSON: {args.json}")
    # Exit status (for CI): 1 when pycyxwiz was asked for and could not run or failed at some size;
    # the other libraries are optional, so their absence or failure is reported but does not count.
    if "pycyxwiz" in args.backends:
        cx_runs = [r for r in runs if r["backend"] == "pycyxwiz"]
        if "pycyxwiz" in skipped or any(r["errors"] or not r["results"] for r in cx_runs):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
