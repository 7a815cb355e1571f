"""All-reduce benchmark: pycyxwiz (cx.distributed) over shared memory and over its TCP ring, against
Open MPI over shared memory and over TCP (mpi4py) and Gloo (torch.distributed), side by side in one run,
on one machine.

    python benchmarks/allreduce.py                                  # world sizes 2 4, 4 KiB..256 MiB, every library present
    python benchmarks/allreduce.py --quick                          # CI smoke run: 2 ranks, 4 KiB..1 MiB, pycyxwiz only
    python benchmarks/allreduce.py --world-sizes 2 --max-bytes 16777216 --repeats 2 --plot ar.png --json ar.json
    python benchmarks/allreduce.py --backends pycyxwiz mpi-shm      # only the two shared-memory libraries

Backends (--backends; default all, in this order, which is also the order of the columns), and their labels:
  pycyxwiz      "pycyxwiz (shm)"  cx.distributed, CYXWIZ_TRANSPORT unset in the ranks (auto: shared memory when
                                  all ranks are on one host); the label shows the get_config().transport the
                                  ranks reported
  mpi-shm       "Open MPI shm"    mpirun --mca pml ob1 --mca btl vader,self ("sm" instead of "vader" where
                                  ompi_info lists no vader, as in Open MPI 5)
  pycyxwiz-shared "pycyxwiz shared" as pycyxwiz, each rank's array made by cx.distributed._shared_zeros (how
                                  DDP makes its gradient buckets): all_reduce reads the peers' arrays where they lie
  pycyxwiz-tcp  "pycyxwiz TCP"    cx.distributed with CYXWIZ_TRANSPORT=tcp in the ranks (the TCP ring)
  mpi           "Open MPI TCP"    mpirun --mca pml ob1 --mca btl tcp,self (loopback)
  gloo          "Gloo"            torch.distributed backend "gloo" (TCP loopback)
Ratio columns "A/B" = B's median time / A's: pycyxwiz against each other backend, and pycyxwiz TCP against
Open MPI TCP and Gloo (the TCP-only comparison of earlier results).

Method (as in ../shared/BASELINES.md, "How to measure like the anchors"): float32, SUM, in place, one
process per rank and one thread per rank, the same rank-side code for every library
(benchmarks/allreduce_worker.py). Per size: one checked call, 3 warm-up calls, then n timed calls with a
barrier before each (n fills --seconds, at least 10, at most --max-iters); one call's time is the
slowest rank's; the median over the calls is reported. Then n calls back to back without barriers
(nccl-tests style): total time / n, slowest rank. algbw = bytes / time, busbw = algbw * 2(N-1)/N,
1 GB = 1e9 bytes. The TCP loopback limit is measured in the same run (benchmarks/allreduce_loopback.py).
The tables and the plot are drawn by benchmarks/allreduce_report.py.

A library that is missing is skipped with the reason; one that fails or hangs is reported (every run
has a timeout per size, and every process it started is killed, and shared-memory files its ranks left
are removed) and the others go on. Exit status 1 when pycyxwiz (either transport) was asked for and
could not run or failed at some size.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import allreduce_loopback  # noqa: E402
# Re-exported: train_throughput.py and gpu_step.py import md_table (and the process helpers) from here.
from allreduce_report import BACKENDS, LABEL, busbw, human, labels, md_table, plot, print_tables, summarize  # noqa: E402,F401
from allreduce_report import fmt_bw, legend  # noqa: E402

WORKER = os.path.join(HERE, "allreduce_worker.py")
ALL_BACKENDS = list(BACKENDS)
LIBRARY = {"pycyxwiz": "pycyxwiz", "pycyxwiz-shared": "pycyxwiz", "pycyxwiz-tcp": "pycyxwiz", "gloo": "gloo", "mpi": "mpi", "mpi-shm": "mpi"}
CYXWIZ_FAMILY = ("pycyxwiz", "pycyxwiz-shared", "pycyxwiz-tcp")  # pycyxwiz itself: its failure sets the exit status
MPIRUN_TCP = ["--allow-run-as-root", "--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
              "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def mpirun_shm(component, backing_dir=None):
    """Open MPI over shared memory: the ob1 PML with the vader (Open MPI 3-4) or sm (Open MPI 5) BTL. The
    segments go to a private directory in /dev/shm (same tmpfs as the default) so a killed job leaves none."""
    return (["--allow-run-as-root", "--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl", f"{component},self",
             "--mca", "oob_tcp_if_include", "lo"]
            + (["--mca", f"btl_{component}_backing_directory", backing_dir] if backing_dir else []))


START_TIMEOUT_S = 120.0  # imports (torch) and rendezvous on a busy 2-core machine


def log(msg):
    print(msg, file=sys.stderr, flush=True)


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
    v["ompi_shm"] = ompi_shm_component()
    v["iperf3"] = allreduce_loopback.iperf3_version()
    return v


def ompi_shm_component():
    """Open MPI's shared-memory BTL as `ompi_info` lists it: "vader" (Open MPI 3.x-4.x) or "sm" (5.x)."""
    ompi_info = shutil.which("ompi_info")
    if not ompi_info:
        return {"error": "ompi_info not found (apt-get install openmpi-bin)"}
    rc, out, err = run_text([ompi_info, "--parsable"], timeout=60)
    if rc != 0:
        return {"error": f"ompi_info failed: {(err.strip() or out.strip() or f'rc {rc}')[-200:]}"}
    btls = sorted({ln.split(":")[2] for ln in out.splitlines() if ln.startswith("mca:btl:") and ln.count(":") > 3})
    for name in ("vader", "sm"):
        if name in btls:
            return {"component": name, "btls": btls}
    return {"error": f"ompi_info lists no shared-memory BTL (vader or sm); BTLs: {', '.join(btls) or 'none'}"}


def availability(v):
    """backend -> None (usable) or the reason it is not."""
    why = {}
    p = v["pycyxwiz"]
    why["pycyxwiz"] = (f"import pycyxwiz failed: {p['error']}" if "error" in p else
                       None if p.get("distributed") else "this pycyxwiz has no cx.distributed.all_reduce")
    why["pycyxwiz-tcp"] = why["pycyxwiz-shared"] = why["pycyxwiz"]
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
    why["mpi-shm"] = why["mpi"] or v["ompi_shm"].get("error")
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


def remove_leftovers(backend, procs, args):
    """After kill_all: the files this job's processes made and, killed, could not remove; returns those worth
    reporting. pycyxwiz's rank 0 names its segment /dev/shm/cyxwiz-<its pid>-<random> and unlinks it once every
    rank attached, so only a job killed during init leaves one. Files of other processes (tests running beside
    the benchmark) are never touched: only names with our processes' pids, and our private directory."""
    gone = []
    if LIBRARY[backend] == "pycyxwiz":
        for path in (f for p in procs for f in glob.glob(f"/dev/shm/cyxwiz-{p.pid}-*")):
            try:
                os.unlink(path)
                gone.append(os.path.basename(path))
            except OSError:
                pass
    elif LIBRARY[backend] == "mpi" and procs:
        # A killed mpirun leaves its session directory, <TMPDIR>/ompi.<host>.<uid>/pid.<mpirun's pid>, and
        # vader's segments (in this run's private directory): expected after a kill, so not reported.
        if backend == "mpi-shm" and args.mpi_shm_dir:
            for path in glob.glob(os.path.join(args.mpi_shm_dir, "*")):
                try:
                    os.unlink(path)
                except OSError:
                    shutil.rmtree(path, ignore_errors=True)
        base = os.environ.get("TMPDIR") or os.environ.get("TEMP") or os.environ.get("TMP") or "/tmp"
        for path in glob.glob(os.path.join(base, "ompi.*", f"pid.{procs[0].pid}")):
            shutil.rmtree(path, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(path))  # only when no other Open MPI job uses it
            except OSError:
                pass
    return gone


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
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "CYXWIZ_TRANSPORT", "CYXWIZ_BENCH_SHARED"):
        env.pop(k, None)
    env.update(CYXWIZ_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "pycyxwiz-tcp":
        env["CYXWIZ_TRANSPORT"] = "tcp"  # "pycyxwiz" runs with it unset: auto, shared memory on one host
    if backend == "pycyxwiz-shared":
        env["CYXWIZ_BENCH_SHARED"] = "1"  # the worker's arrays come from _shared_zeros
    wcmd = [sys.executable, "-u", WORKER, "--backend", LIBRARY[backend], "--sizes", ",".join(map(str, sizes)),
            "--seconds", str(args.seconds), "--max-iters", str(args.max_iters), "--min-iters", str(args.min_iters),
            "--warmup", str(args.warmup)]
    tag = f"{backend}-{world}-{port}"
    procs, outs, errs = [], [], []
    try:
        if LIBRARY[backend] == "mpi":
            flags = MPIRUN_TCP if backend == "mpi" else mpirun_shm(args.ompi_shm_component, args.mpi_shm_dir)
            cmd = [shutil.which("mpirun") or "mpirun"] + flags + (["--oversubscribe"] if world > cpus else []) + [
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
                    if ready.get("transport"):
                        log(f"  [{LABEL[backend]} x{world}] transport {ready['transport']}")
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
        leftovers = remove_leftovers(backend, procs, args)
    if leftovers:
        notes.append(f"removed shared-memory files the killed ranks left: {', '.join(leftovers)}")
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


# ----------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", type=int, nargs="+", default=None, help="default 2 4 (--quick: 2)")
    p.add_argument("--min-bytes", type=int, default=4096, help="smallest size (default 4096); sizes go up by x4")
    p.add_argument("--max-bytes", type=int, default=None, help="largest size (default 268435456; --quick: 1048576)")
    p.add_argument("--backends", nargs="+", choices=ALL_BACKENDS, default=None,
                   help=f"default: all, in this order: {' '.join(ALL_BACKENDS)} (those not installed are skipped); "
                        "--quick: pycyxwiz")
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
    knobs = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                     if k.startswith("CYXWIZ_") and k not in ("CYXWIZ_NUM_THREADS", "CYXWIZ_TRANSPORT"))
    print(f"pycyxwiz  {p.get('version', p.get('error'))}" + (f", installed module built {p['built']}" if p.get("built") else "")
          + (f"; source tree at git {mach['git']}" if mach.get("git") else "") + (f"; {knobs}" if knobs else ""))
    print("          pycyxwiz: CYXWIZ_TRANSPORT unset in the ranks (auto); pycyxwiz-tcp: CYXWIZ_TRANSPORT=tcp"
          + (f" (this shell's CYXWIZ_TRANSPORT={os.environ['CYXWIZ_TRANSPORT']} is not passed on)"
             if "CYXWIZ_TRANSPORT" in os.environ else ""))
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
    comp = ver["ompi_shm"].get("component")
    print("mpi-shm   " + (f"mpirun {' '.join(mpirun_shm(comp, '<private dir in /dev/shm>'))} "
                           f"[--oversubscribe when ranks > {cpus}] -np N; the same call" if comp else
                           ver["ompi_shm"].get("error", "?")))
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
                  + (f" (--quick measures pycyxwiz only; add --backends {' '.join(ALL_BACKENDS)})"
                     if args.quick and not args.backends_given else ""))
    if {"mpi", "mpi-shm"} & set(backends) and "Open MPI" not in ver["mpi4py"].get("library", "Open MPI"):
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
    args.ompi_shm_component = comp
    args.mpi_shm_dir = None
    if "mpi-shm" in backends and os.access("/dev/shm", os.W_OK):
        args.mpi_shm_dir = tempfile.mkdtemp(prefix="allreduce_bench_ompi_", dir="/dev/shm")
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
        if args.mpi_shm_dir:
            shutil.rmtree(args.mpi_shm_dir, ignore_errors=True)

    table_backends = backends + [b for b in skipped]
    lab = labels(runs, table_backends)
    s = summarize(runs, table_backends, args.world_sizes, args.sizes)
    print("\n## All-reduce, float32 SUM in place: median time and bus bandwidth\n")
    print(legend(lab))
    print_tables(s, table_backends, backends, lab, args.world_sizes, args.sizes, args.repeats, run_lookup)

    problems = []
    for r in runs:
        tagr = f"{LABEL[r['backend']]}, {r['world_size']} ranks" + (f", repeat {r['repeat'] + 1}" if args.repeats > 1 else "")
        for n, e in sorted(r["errors"].items()):
            problems.append(f"- {tagr}, {human(n)}: {e}")
        for note in r["notes"]:
            problems.append(f"- {tagr}: {note[:800]}")
        got = (r.get("ready") or {}).get("transport")
        want = {"pycyxwiz": "shm", "pycyxwiz-shared": "shm", "pycyxwiz-tcp": "tcp"}.get(r["backend"])
        if got and want and got != want:
            problems.append(f"- {tagr}: the ranks reported transport {got}, not {want}")
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
        if plot(args.plot, s, backends, lab, args.world_sizes, args.sizes, loop, log=log):
            print(f"Plot: {args.plot}")
    if args.json:
        doc = {"machine": mach, "versions": ver, "skipped": skipped, "loopback": loop,
               "config": {k: v for k, v in vars(args).items()}, "labels": lab, "wall_s": wall,
               "runs": [dict(r, results=list(r["results"].values()),
                             errors={str(k): v for k, v in r["errors"].items()}) for r in runs],
               "summary": [{"backend": b, "label": lab[b], "world_size": w, "bytes": n, "median_us": e["med_us"],
                            "b2b_us": e["med_b2b_us"], "busbw_GBps": e["busbw"], "b2b_busbw_GBps": e["b2b_busbw"],
                            "per_repeat_median_us": e["median_us"], "per_repeat_b2b_us": e["b2b_us"],
                            "errors": e["errors"]} for (b, w, n), e in s.items()]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"JSON: {args.json}")
    # Exit status (for CI): 1 when pycyxwiz (either transport) was asked for and could not run or failed at
    # some size; the other libraries are optional, so their absence or failure is reported but does not count.
    for b in CYXWIZ_FAMILY:
        if b in args.backends:
            cx_runs = [r for r in runs if r["backend"] == b]
            if b in skipped or any(r["errors"] or not r["results"] for r in cx_runs):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
