"""Several "hosts" made of Linux network namespaces joined by a veth pair.

Namespace A holds 10.77.X.1/24, namespace B 10.77.X.2/24; each has only its loopback and its end of
the veth, so a rank in B can reach rank 0 in A only through 10.77.X.1, and a rank that published
127.0.0.1 as its ring address could not be reached from the other namespace at all. The ranks run
with `ip netns exec`, MASTER_ADDR=10.77.X.1 everywhere.

Needs root (CAP_SYS_ADMIN) and iproute2; skips when namespaces cannot be made here (containers).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux only")

_counter = itertools.count()

RANK_SCRIPT = r'''
import json, os, sys, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed

def emit(tag, **kw):
    print(tag + " " + json.dumps(kw), flush=True)

def error(e, t0, tag):
    emit(tag, cls=type(e).__name__, msg=str(e), elapsed=time.monotonic() - t0)

t0 = time.monotonic()
try:
    D.init()
except Exception as e:
    error(e, t0, "INIT_ERROR")
    sys.exit(3)
r, n = D.get_rank(), D.get_world_size()
count = 1 << 18                                   # 1 MB of float32: the ring path
a = np.arange(count, dtype=np.float32) + r
D.all_reduce(a)
expected = n * np.arange(count, dtype=np.float32) + n * (n - 1) / 2
g = D.all_gather(np.array([r, 100 + r], np.int64))
c = D.get_config()
emit("RESULT", rank=r, world=n, sum_ok=bool(np.array_equal(a, expected)), head=a[:3].tolist(),
     gathered=[x.tolist() for x in g], master_addr=c.master_addr, source=c.source)

if os.environ.get("PROBE") == "1":
    # Rank 1 stays away; rank 0 broadcasts more than the socket buffers hold, so it times out
    # sending to rank 1, and the message names rank 1 by the ring address rank 1 published.
    D.barrier()
    if r == 1:
        emit("SLEEPING")
        time.sleep(60)
        sys.exit(0)
    big = np.zeros(16 << 20, np.float32)          # 64 MB
    t1 = time.monotonic()
    try:
        D.broadcast(big, src=0)
        emit("PROBE_DONE")
    except Exception as e:
        error(e, t1, "PROBE")
    sys.stdout.flush()
    os._exit(0)
D.finalize()
'''


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


class NetnsPair:
    """Two namespaces A and B joined by a veth pair: A has 10.77.X.1/24, B 10.77.X.2/24."""

    def __init__(self):
        n = next(_counter)
        tag = f"{os.getpid() % 100000}{n}"
        self.a, self.b = f"cxA{tag}", f"cxB{tag}"
        self.x = (os.getpid() + n) % 250 + 1
        self.addr_a, self.addr_b = f"10.77.{self.x}.1", f"10.77.{self.x}.2"
        self.veth_a, self.veth_b = f"cxa{tag}"[:15], f"cxb{tag}"[:15]
        self.created: list[str] = []
        self.veth_in_root = False  # created but not yet moved into the namespaces

    def setup(self) -> None:
        for ns in (self.a, self.b):
            res = _ip("netns", "add", ns, check=False)
            if res.returncode != 0:
                pytest.skip(f"cannot create a network namespace here (ip netns add: {res.stderr.strip()})")
            self.created.append(ns)
        res = _ip("link", "add", self.veth_a, "type", "veth", "peer", "name", self.veth_b, check=False)
        if res.returncode != 0:
            pytest.skip(f"cannot create a veth pair here (ip link add ... type veth: {res.stderr.strip()})")
        self.veth_in_root = True
        _ip("link", "set", self.veth_a, "netns", self.a)
        _ip("link", "set", self.veth_b, "netns", self.b)
        self.veth_in_root = False
        for ns, dev, addr in ((self.a, self.veth_a, self.addr_a), (self.b, self.veth_b, self.addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
        # The pair works: A reaches B through the veth, and nothing else is in either namespace.
        assert self.addr_b in _ip("-n", self.b, "-4", "addr", "show", "dev", self.veth_b).stdout

    def teardown(self) -> None:
        for ns in self.created:  # deleting a namespace deletes its end of the veth, and so the pair
            _ip("netns", "del", ns, check=False)
        if self.veth_in_root:
            _ip("link", "del", self.veth_a, check=False)


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    pair = NetnsPair()
    try:
        pair.setup()
        yield pair
    finally:
        pair.teardown()


def start_in(ranks, ns: str, rank: int, world: int, env: dict):
    """Starts one rank inside namespace `ns`, tracked (and killed at the end) by the ranks harness."""
    path = ranks.tmp_path / "rank_script.py"
    if not path.exists():
        path.write_text(textwrap.dedent(RANK_SCRIPT))
    return ranks.popen(["ip", "netns", "exec", ns, sys.executable, path], ranks.env(rank, world, env), rank=rank)


def records(out: str, tag: str) -> list[dict]:
    return [json.loads(line[len(tag) + 1:]) for line in out.splitlines() if line.startswith(tag + " ")]


def check_results(results, world: int, master: str, report: str) -> None:
    assert all(r.rc == 0 for r in results), report
    for res in results:
        (rec,) = records(res.out, "RESULT")
        assert rec["rank"] == res.rank and rec["world"] == world, report
        assert rec["sum_ok"], report
        assert rec["head"] == [world * (world - 1) / 2 + world * i for i in range(3)], report
        assert rec["gathered"] == [[k, 100 + k] for k in range(world)], report
        assert rec["master_addr"] == master and rec["source"] == "RANK/WORLD_SIZE", report


@pytest.mark.parametrize("layout", [(0, 1), (0, 0, 1, 1)], ids=["2ranks", "4ranks_2per_host"])
def test_ranks_in_two_namespaces(ranks, netns, layout):
    """layout[r]: 0 = rank r runs in namespace A (with rank 0), 1 = in namespace B."""
    world = len(layout)
    env = {"MASTER_ADDR": netns.addr_a, "DISTRIBUTED_TIMEOUT_MS": "20000"}
    procs = [start_in(ranks, (netns.a, netns.b)[host], r, world, env) for r, host in enumerate(layout)]
    results = ranks.wait(procs, timeout=60)
    check_results(results, world, netns.addr_a, ranks.report(results))


def test_ring_address_is_the_interface_that_reaches_rank_0(ranks, netns):
    """Rank 1 in B publishes 10.77.X.2 (not 127.0.0.1): rank 0 dials it, and names it in errors."""
    # The namespaces share IPC and /dev/shm, so auto would pick shared memory: the links are under test.
    env = {"MASTER_ADDR": netns.addr_a, "DISTRIBUTED_TIMEOUT_MS": "5000", "PROBE": "1", "CYXWIZ_TRANSPORT": "tcp"}
    p0 = start_in(ranks, netns.a, 0, 2, env)
    p1 = start_in(ranks, netns.b, 1, 2, env)
    (r0,) = ranks.wait([p0], timeout=60)
    try:
        os.killpg(p1.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    (r1,) = ranks.wait([p1], timeout=20)
    report = ranks.report([r0, r1])

    for res in (r0, r1):
        (rec,) = records(res.out, "RESULT")
        assert rec["sum_ok"] and rec["master_addr"] == netns.addr_a, report
    assert records(r1.out, "SLEEPING"), report
    assert r0.rc == 0 and not records(r0.out, "PROBE_DONE"), report
    (probe,) = records(r0.out, "PROBE")
    assert probe["cls"] == "DistTimeoutError", report
    # rank 0's right neighbour is rank 1, at the address rank 1 published for its ring listener.
    assert re.search(rf"rank 1 \({re.escape(netns.addr_b)}:\d+\)", probe["msg"]), report
    assert "127.0.0.1" not in probe["msg"], report
    assert 4.0 <= probe["elapsed"] < 15.0, report


def test_unreachable_master_addr_times_out(ranks, netns):
    """A rank in B pointed at an address nobody has (10.77.X.99): DistTimeoutError within the timeout."""
    unreachable = f"10.77.{netns.x}.99"
    env = {"MASTER_ADDR": unreachable, "DISTRIBUTED_TIMEOUT_MS": "3000"}
    (res,) = ranks.wait([start_in(ranks, netns.b, 1, 2, env)], timeout=40)
    report = ranks.report([res])
    assert res.rc == 3, report
    (e,) = records(res.out, "INIT_ERROR")
    assert e["cls"] == "DistTimeoutError", report
    assert e["msg"].startswith("[rank 1/2] init: "), report
    assert unreachable in e["msg"] and "3000 ms" in e["msg"], report
    assert 2.5 <= e["elapsed"] < 10.0, report
