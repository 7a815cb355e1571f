"""A cut cable between two machines, made of two network namespaces joined by a veth pair
(test_multihost_netns.NetnsPair): rank 0 in A, rank 1 in B, then B's end of the link goes down.
Rank 0's packets to rank 1 now vanish without an answer, as on a cut cable: it must say that rank 1
is unreachable (its machine acknowledges nothing), not only that rank 1 was silent. Cut during a
loop of all_reduces: within about the timeout. Cut while the ranks compute (idle links): keepalive
and TCP_USER_TIMEOUT end the connections meanwhile, and the next all_reduce fails at once.

Needs root and iproute2; skips where namespaces cannot be made.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time

import pytest

import pycyxwiz as cx

from test_multihost_netns import _ip, netns  # noqa: F401  (netns: the two-namespace fixture)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux only")

CUT_SCRIPT = r'''
import json, os, sys, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed

def emit(tag, **kw):
    print(tag + " " + json.dumps(kw), flush=True)

D.init()
a = np.ones(1 << 18, np.float32)                  # 1 MB: the ring path
D.all_reduce(a)
emit("READY")
time.sleep(float(os.environ["IDLE_S"]))           # "computing": the links carry nothing
t0 = time.monotonic()
try:
    while True:
        t0 = time.monotonic()
        D.all_reduce(a, op=D.ReduceOp.MAX)
except Exception as e:
    emit("ERROR", cls=type(e).__name__, msg=str(e), elapsed=time.monotonic() - t0)
    sys.exit(3)
'''


def start_in(ranks, ns: str, rank: int, env: dict) -> subprocess.Popen:
    path = ranks.tmp_path / "cut_script.py"
    path.write_text(textwrap.dedent(CUT_SCRIPT))
    return ranks.popen(["ip", "netns", "exec", ns, sys.executable, path], ranks.env(rank, 2, env), rank=rank)


def wait_for_line(p: subprocess.Popen, tag: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.startswith(tag):
            return
        if not line and p.poll() is not None:
            break
    pytest.fail(f"rank {p.rank} did not print {tag}: rc={p.poll()} {p.stderr.read() if p.poll() is not None else ''}")


@pytest.mark.parametrize("idle_s", [0, 9], ids=["busy", "idle"])
def test_cut_link_is_reported_as_unreachable(ranks, netns, idle_s):  # noqa: F811
    timeout_ms = 3000
    # The namespaces share IPC and /dev/shm, so auto would pick shared memory: the link is under test.
    env = {"MASTER_ADDR": netns.addr_a, "DISTRIBUTED_TIMEOUT_MS": str(timeout_ms), "IDLE_S": idle_s,
           "CYXWIZ_TRANSPORT": "tcp"}
    p0 = start_in(ranks, netns.a, 0, env)
    p1 = start_in(ranks, netns.b, 1, env)
    wait_for_line(p0, "READY", timeout=60)
    wait_for_line(p1, "READY", timeout=60)
    time.sleep(0.3)                                         # inside the loop of all_reduces
    cut_at = time.monotonic()
    _ip("-n", netns.b, "link", "set", netns.veth_b, "down")   # the cable: nothing crosses any more
    (r0,) = ranks.wait([p0], timeout=30)
    arrived = time.monotonic()
    (r1,) = ranks.wait([p1], timeout=10)
    report = ranks.report([r0, r1])

    assert r0.rc == 3, report
    (line,) = [l for l in r0.out.splitlines() if l.startswith("ERROR ")]
    e = json.loads(line[len("ERROR "):])
    if cx.build_info()["platform"] != "native":
        # Without Linux's TCP_INFO and TCP_USER_TIMEOUT (macOS, the portable POSIX build) a cut link
        # under traffic looks like a stopped peer: the timeout names it. An idle one is ended by
        # keepalive (9 probes a second apart here), "unreachable" as on Linux, when its probes ran out
        # before the next call; either way the call ends within about the timeout, naming the peer.
        for r, peer, addr in ((r0, 1, netns.addr_b), (r1, 0, netns.addr_a)):
            assert r.rc == 3, report
            (line,) = [l for l in r.out.splitlines() if l.startswith("ERROR ")]
            err = json.loads(line[len("ERROR "):])
            timed_out = rf"no data from rank {peer} \({re.escape(addr)}:\d+\) within the timeout"
            unreachable = rf"rank {peer} at {re.escape(addr)}:\d+ unreachable"
            assert (err["cls"], bool(re.search(timed_out if err["cls"] == "DistTimeoutError" else unreachable, err["msg"]))) \
                in (("DistTimeoutError", True), ("DistNetworkError", True)), report
        assert arrived - cut_at < idle_s + timeout_ms / 1000 + 5.0, report
        return
    assert e["cls"] == "DistNetworkError", report
    assert e["msg"].startswith("[rank 0/2] all_reduce #"), report
    assert re.search(rf"rank 1 at {re.escape(netns.addr_b)}:\d+ unreachable", e["msg"]), report
    if idle_s == 0:
        # About the timeout after the cut: not at once (nothing said the link went), not much later.
        assert timeout_ms / 1000 - 0.5 <= arrived - cut_at < timeout_ms / 1000 + 5.0, report
    else:
        # The kernel gave up on the idle connection (after 1.5 x the timeout): the call fails at once.
        assert e["elapsed"] < 1.0 and arrived - cut_at < idle_s + 3.0, report
    # Rank 1's side of the cut (its link down) says the same of rank 0.
    assert r1.rc == 3, report
    (line,) = [l for l in r1.out.splitlines() if l.startswith("ERROR ")]
    e1 = json.loads(line[len("ERROR "):])
    assert e1["cls"] == "DistNetworkError", report
    assert re.search(rf"rank 0 at {re.escape(netns.addr_a)}:\d+ unreachable", e1["msg"]), report
