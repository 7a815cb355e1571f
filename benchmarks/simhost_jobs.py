"""What the simulated-host benchmarks share (benchmarks/simhosts.py, benchmarks/gradient_dtype_simhosts.py):
reading a veth's tx bytes on the rank side, and on the driver side loading tests/simhosts.py and running
one job of ranks across the hosts, every process killed at the end however the job ends."""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The launcher variables of the caller, which must not leak into the ranks.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def tx_bytes(dev):
    """This network namespace's tx bytes of `dev` (/proc/net/dev follows the reader's namespace)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                return int(rest.split()[8])
    raise RuntimeError(f"{dev} is not in /proc/net/dev")


def rate_bytes_per_s(rate):
    """tc's rate ("1gbit", "500mbit") in bytes per second; None for "none"."""
    for u, k in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1)):
        if rate.endswith(u):
            return float(rate[:-len(u)]) * k / 8
    return None


def load_simhosts():
    """tests/simhosts.py (SimHosts, Unavailable), imported by path (benchmarks/simhosts.py has the same name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tests_simhosts", os.path.join(os.path.dirname(HERE), "tests", "simhosts.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SimHosts, mod.Unavailable


def run_job(hosts, ranks_per_host, argv, port, *, secret, timeout, what, transport="auto", error_tag=None, env=None):
    """Runs `argv` as 2 x `ranks_per_host` ranks (rank r on host r // ranks_per_host, MASTER_ADDR on the
    first host; each rank told its local index and veth in SIMHOST_LOCAL / SIMHOST_VETH) and returns rank 0's
    (stdout, stderr), or raises naming the first rank that failed (its `error_tag` line from stdout, if
    any, and its stderr's end); `env`: more variables for every rank. Every process in the hosts is killed when it ends, however it ends."""
    world = 2 * ranks_per_host
    env0 = {k: v for k, v in os.environ.items()
            if not k.startswith(("CYXWIZ_", "DISTRIBUTED_")) and k not in _LAUNCH_VARS}
    env0.update(WORLD_SIZE=str(world), MASTER_ADDR=hosts.addrs[0], MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
                CYXWIZ_NUM_THREADS="1", DISTRIBUTED_TIMEOUT_MS="120000", CYXWIZ_SECRET=secret)
    if transport == "tcp":
        env0["CYXWIZ_TRANSPORT"] = "tcp"
    env0.update(env or {})
    procs, outs = [], []
    deadline = time.monotonic() + timeout
    try:
        for r in range(world):
            h = r // ranks_per_host
            env = dict(env0, RANK=str(r), SIMHOST_LOCAL=str(r % ranks_per_host), SIMHOST_VETH=hosts.veths[h])
            procs.append(hosts.popen_on(hosts.names[h], argv, env, cwd=HERE))
        for r, p in enumerate(procs):
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{what}: no result within {timeout:.0f} s (rank {r} still running)") from None
        bad = [(r, p.returncode, o, e) for r, (p, (o, e)) in enumerate(zip(procs, outs)) if p.returncode != 0]
        if bad:
            r, rc, o, e = bad[0]
            errs = [ln for ln in o.splitlines() if error_tag and ln.startswith(error_tag)]
            raise RuntimeError(f"{what}: rank {r} exited {rc}: {(errs[0] + ' ' if errs else '') + e.strip()[-1500:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        for pid in hosts.pids():  # anything a rank left behind
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    return outs[0]
