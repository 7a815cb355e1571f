"""Four ranks on two simulated hosts (tests/simhosts.py): ranks 0, 1 on host A, ranks 2, 3 on host B.

Each host has its own network, IPC namespace and /dev/shm, so ranks 0, 1 can share memory and reach
B only through the veth pair, as two machines with two ranks each. By default all_reduce is then
hierarchical ("shm+tcp": reduce-scatter over shared memory in each host, the slices across the link
between counterparts, all-gather in each host); CYXWIZ_TRANSPORT=tcp keeps the flat TCP ring.
The oracles: numpy's reduction of the inputs every rank builds from a seed, one process training on
the whole batch, the flat ring's bytes on the link, and a cut cable that must end every rank.

Needs root, iproute2 and util-linux; skips where the namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from simhosts import hosts_or_skip
from test_ddp import PRELUDE

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="simulated hosts need Linux namespaces and root")

LAYOUT = (0, 0, 1, 1)  # host of each rank
WORLD = len(LAYOUT)
TRANSPORTS = [(None, "shm+tcp"), ("tcp", "tcp")]  # CYXWIZ_TRANSPORT, what get_config() must say


@pytest.fixture
def hosts():
    h = hosts_or_skip()
    try:
        yield h
    finally:
        h.cleanup()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(n in left for n in h.names), f"namespaces left behind: {left}"
        assert not os.path.exists(h.dir), f"{h.dir} left behind"


def start(ranks, hosts, code: str, env: dict, name: str = "rank_script.py", layout=LAYOUT):
    """Starts rank r of `code` on host layout[r], through the harness (killed when the test ends)."""
    path = ranks.script(code, name)
    env = {"MASTER_ADDR": hosts.addrs[layout[0]], "CYXWIZ_TRANSPORT": "<unset>", **env}
    return [ranks.popen(hosts.argv_on(hosts.names[h], [sys.executable, path], cwd=ranks.tmp_path),
                        ranks.env(r, len(layout), env), rank=r) for r, h in enumerate(layout)]


def records(results, tag: str) -> list[dict]:
    """The one `tag {json}` line of each rank, in rank order."""
    out = []
    for res in results:
        lines = [line for line in res.out.splitlines() if line.startswith(tag + " ")]
        assert len(lines) == 1, f"rank {res.rank}: {len(lines)} {tag} lines"
        out.append(json.loads(lines[0][len(tag) + 1:]))
    return out


def wait_files(paths, procs, timeout: float) -> None:
    """Waits until every path exists; fails at once when a process exits, or at the deadline."""
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"rank {dead[0].rank} exited {dead[0].returncode}: {dead[0].stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"not there after {timeout} s: {[p for p in paths if not os.path.exists(p)]}"
        time.sleep(0.02)


# --- all_reduce against numpy -----------------------------------------------------------------------

# Run by the ranks and by the test: the same inputs from the same seeds.
INPUTS = r'''
import numpy as np
CASES = {"f32_sum": ("float32", "SUM"), "f32_avg": ("float32", "AVG"), "i64_sum": ("int64", "SUM"),
         "f32_max": ("float32", "MAX"), "f64_avg": ("float64", "AVG"), "i64_min": ("int64", "MIN")}
SIZES = [0, 1, 3, 1000, 65537, 1 << 20]  # 3: fewer elements than ranks; 1 << 20 float32: 4 MiB


def make(rank, count, case):
    rng = np.random.default_rng([7, rank, count, list(CASES).index(case)])
    if CASES[case][0] == "int64":
        return rng.integers(-(1 << 40), 1 << 40, count, dtype=np.int64)
    return rng.standard_normal(count).astype(CASES[case][0])
'''

ALL_REDUCE = INPUTS + r'''
import hashlib, json, os
import pycyxwiz as cx
D = cx.distributed
D.init()
r, n = D.get_rank(), D.get_world_size()
hashes, mine = {}, {}
for case in os.environ["CASES"].split(","):
    for count in map(int, os.environ["SIZES"].split(",")):
        x = make(r, count, case)
        D.all_reduce(x, op=getattr(D.ReduceOp, CASES[case][1]))
        hashes[f"{case}/{count}"] = hashlib.sha256(x.tobytes()).hexdigest()
        mine[f"{case}_{count}"] = x
        # The other collectives stay on the flat ring: still in step with it after each all_reduce.
        g = D.all_gather(np.array([r, count], np.int64))
        assert [list(a) for a in g] == [[k, count] for k in range(n)], g
if r == 0:
    np.savez(os.environ["OUT"], **mine)
print("RESULT " + json.dumps({"rank": r, "transport": D.get_config().transport, "hashes": hashes}), flush=True)
D.finalize()
'''


def oracle(case: str, count: int, world: int, ns: dict) -> np.ndarray:
    stack = np.stack([ns["make"](r, count, case) for r in range(world)])
    op = ns["CASES"][case][1]
    if op in ("MAX", "MIN"):
        return stack.max(axis=0) if op == "MAX" else stack.min(axis=0)
    if op == "AVG":
        return stack.astype(np.float64).mean(axis=0)
    return stack.sum(axis=0) if stack.dtype == np.int64 else stack.astype(np.float64).sum(axis=0)


def check_all_reduce(ranks, hosts, setting, expected, layout=LAYOUT, cases=None, sizes=None) -> None:
    """Runs ALL_REDUCE on `layout`; rank 0's results must be numpy's, every rank's the same bytes."""
    ns: dict = {}
    exec(INPUTS, ns)
    cases, sizes = cases or list(ns["CASES"]), sizes or ns["SIZES"]
    out = ranks.tmp_path / "rank0.npz"
    env = {"OUT": out, "CASES": ",".join(cases), "SIZES": ",".join(map(str, sizes)),
           **({"CYXWIZ_TRANSPORT": setting} if setting else {})}
    results = ranks.wait(start(ranks, hosts, ALL_REDUCE, env, layout=layout), timeout=45)
    report = ranks.report(results)[-6000:]
    assert all(r.rc == 0 for r in results), report
    reps = records(results, "RESULT")
    got = np.load(out)
    for case in cases:
        dtype = ns["CASES"][case][0]
        for count in sizes:
            key = f"{case}/{count}"
            x, want = got[f"{case}_{count}"], oracle(case, count, len(layout), ns)
            assert x.dtype == np.dtype(dtype) and x.shape == (count,), key
            if dtype == "int64" or case == "f32_max":  # exact whatever the order of reduction
                assert np.array_equal(x, want), f"{key}: {np.flatnonzero(x != want)[:5]} differ"
            else:
                bad = ~np.isclose(x, want, rtol=1e-6, atol=1e-6)
                assert not bad.any(), f"{key}: {bad.sum()} of {count} differ, first at {np.flatnonzero(bad)[0]}"
            hashes = {rep["rank"]: rep["hashes"][key] for rep in reps}
            assert len(set(hashes.values())) == 1, f"{key}: ranks ended with different bytes: {hashes}"
    assert [rep["transport"] for rep in reps] == [expected] * len(layout), report


@pytest.mark.timeout(60)
@pytest.mark.parametrize("setting, expected", TRANSPORTS, ids=["auto", "tcp"])
def test_all_reduce_matches_numpy(ranks, hosts, setting, expected):
    check_all_reduce(ranks, hosts, setting, expected)


# Hosts by lowest rank, local index by position, whatever the order of the ranks; uneven hosts or
# hosts of one rank keep the flat ring.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout, expected", [((0, 1, 0, 1), "shm+tcp"), ((1, 1, 1, 0, 0, 0), "shm+tcp"),
                                              ((0, 0, 1), "tcp"), ((0, 1), "tcp")],
                         ids=["interleaved", "3per_host", "uneven", "1per_host"])
def test_other_layouts(ranks, hosts, layout, expected):
    check_all_reduce(ranks, hosts, None, expected, layout, ["f32_avg", "i64_sum"], [0, 1, 5, 65537])


# Hosts through a bridge. Three: the ring between hosts has distinct left and right counterparts
# (with two hosts they are the same rank). Four: its small all-reduces take recursive doubling over
# the counterparts' butterfly links (host h XOR 2).
@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [3, 4])
def test_more_hosts_of_two_ranks(ranks, n):
    h = hosts_or_skip(n=n)
    try:
        check_all_reduce(ranks, h, None, "shm+tcp", tuple(r // 2 for r in range(2 * n)),
                         ["f32_avg", "i64_sum", "f32_max"], [0, 5, 1000, 20000, 65537])
    finally:
        h.cleanup()


# --- DDP on 2 x 2 ends where one process ends -------------------------------------------------------

DDP = PRELUDE + r'''
STEPS, N = 3, 64
B = N // WS
D.init()
cfg = D.DDPConfig()
cfg.bucket_size_mb = 0.0005                       # ~500-byte buckets: several all-reduces per step
ddp = D.DistributedDataParallel(build(0), cfg)
expect(ddp.shard_optimizer == (os.environ.get("CYXWIZ_DDP_SHARD_OPTIMIZER") == "1"), "ddp.shard_optimizer")
opt = make_opt("adam")
for step in range(STEPS):
    X, y = batch(step, N)
    out = ddp.forward(shard(X, B))
    ddp.backward(LOSS.backward(out, shard(y, B)))
    ddp.update_parameters(opt)
check_params(f"{WS} ranks x {B} rows vs 1 process x {N} rows", ddp.parameters(), oracle("adam", STEPS, N))
finish(digest=digest(ddp.parameters()), transport=D.get_config().transport)
'''


# overlap "1": bucket all-reduces on the communication thread during backward; "0": all at sync time.
# shard "1": the sharded optimizer step (reduce-scatter and all-gather across the hosts).
@pytest.mark.timeout(60)
@pytest.mark.parametrize("overlap,shard", [("0", "0"), ("1", "0"), ("0", "1")])
def test_ddp_on_two_hosts_matches_one_process(ranks, hosts, overlap, shard):
    env = {"CYXWIZ_DDP_OVERLAP": overlap, "CYXWIZ_DDP_SHARD_OPTIMIZER": shard}
    results = ranks.wait(start(ranks, hosts, DDP, env), timeout=45)
    report = ranks.report(results)[-6000:]
    assert all(r.rc == 0 for r in results), report
    reps = records(results, "RESULT")
    problems = [f"rank {rep['rank']}: {e}" for rep in reps for e in rep["errors"]]
    assert not problems, "\n".join(problems[:20])
    assert len({rep["digest"] for rep in reps}) == 1, f"ranks ended with different parameters: {reps}"
    assert [rep["transport"] for rep in reps] == ["shm+tcp"] * WORLD, report


# --- bytes on the link: hierarchical about 2/3 of the flat ring ------------------------------------

BYTES = r'''
import os, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed

def mark_and_wait(mark, wait):
    open(os.path.join(os.environ["SYNC"], f"{mark}.{D.get_rank()}"), "w").close()
    while not os.path.exists(os.path.join(os.environ["SYNC"], wait)):
        time.sleep(0.01)

D.init()
x = np.ones(4 << 20, np.float32)                  # 16 MiB
D.all_reduce(x)                                   # warm-up: connections, buffers
D.barrier()
mark_and_wait("ready", "go")
for _ in range(int(os.environ["CALLS"])):
    D.all_reduce(x)
D.barrier()                                       # every byte of the calls has arrived
mark_and_wait("done", "end")
print("RESULT", D.get_config().transport, flush=True)
D.finalize()
'''


def link_bytes(ranks, hosts, setting, calls: int) -> tuple[int, str]:
    """Bytes both hosts sent over the link during `calls` all_reduces of 16 MiB; the transport."""
    sync = ranks.tmp_path / f"sync_{setting}"
    sync.mkdir()
    env = {"SYNC": sync, "CALLS": calls, **({"CYXWIZ_TRANSPORT": setting} if setting else {})}
    procs = start(ranks, hosts, BYTES, env, name=f"bytes_{setting}.py")
    wait_files([sync / f"ready.{r}" for r in range(WORLD)], procs, 40)
    before = sum(hosts.tx_bytes(h) for h in hosts.names)
    (sync / "go").touch()
    wait_files([sync / f"done.{r}" for r in range(WORLD)], procs, 40)
    sent = sum(hosts.tx_bytes(h) for h in hosts.names) - before
    (sync / "end").touch()
    results = ranks.wait(procs, timeout=20)
    assert all(r.rc == 0 for r in results), ranks.report(results)[-6000:]
    transports = {line.split()[1] for r in results for line in r.out.splitlines() if line.startswith("RESULT ")}
    return sent, ",".join(sorted(transports))


@pytest.mark.timeout(90)
def test_hierarchical_sends_two_thirds_of_the_flat_rings_bytes(ranks, hosts):
    calls, buffer = 3, 16 << 20
    flat, flat_t = link_bytes(ranks, hosts, "tcp", calls)
    hier, hier_t = link_bytes(ranks, hosts, None, calls)
    msg = (f"link bytes for {calls} x 16 MiB: flat ring ({flat_t}) {flat}, default ({hier_t}) {hier}, "
           f"ratio {hier / flat:.3f}")
    print(msg)
    # Flat ring 0->1->2->3->0 crosses twice: 1.5 buffers per direction per call, 3 in all.
    assert 2.9 * buffer * calls <= flat <= 3.3 * buffer * calls, msg
    assert hier_t == "shm+tcp" and flat_t == "tcp", msg
    assert 0.55 <= hier / flat <= 0.80, msg


# --- a cut cable ends every rank ---------------------------------------------------------------------

CUT = r'''
import json, os, sys, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
a = np.ones(1 << 18, np.float32)                  # 1 MiB
D.all_reduce(a)
open(os.path.join(os.environ["SYNC"], f"ready.{D.get_rank()}"), "w").close()
t0 = time.monotonic()
try:
    while True:
        t0 = time.monotonic()
        D.all_reduce(a, op=D.ReduceOp.MAX)
except Exception as e:
    print("ERROR " + json.dumps({"cls": type(e).__name__, "dist": isinstance(e, D.DistError), "msg": str(e),
                                 "transport": D.get_config().transport, "elapsed": time.monotonic() - t0}), flush=True)
    sys.exit(3)
'''


@pytest.mark.timeout(60)
def test_cut_link_ends_every_rank_with_an_error(ranks, hosts):
    timeout_ms = 6000
    env = {"SYNC": ranks.tmp_path, "DISTRIBUTED_TIMEOUT_MS": timeout_ms}
    procs = start(ranks, hosts, CUT, env)
    wait_files([ranks.tmp_path / f"ready.{r}" for r in range(WORLD)], procs, 40)
    time.sleep(0.3)                                   # inside the loop of all_reduces
    cut_at = time.monotonic()
    hosts.set_link("down")
    ended = {}
    while len(ended) < WORLD and time.monotonic() < cut_at + 40:  # each rank's exit time
        ended.update({p.rank: time.monotonic() - cut_at for p in procs if p.rank not in ended and p.poll() is not None})
        time.sleep(0.05)
    results = ranks.wait(procs, timeout=1)            # kills any rank still running
    report = ranks.report(results)[-6000:] + f"\nexit after the cut (s): {ended}"
    assert all(r.rc == 3 for r in results), report
    errors = records(results, "ERROR")
    for r, e in enumerate(errors):
        print(f"rank {r}: {e['cls']} after {ended[r]:.1f} s: {e['msg']}")
        assert e["dist"] and e["cls"] in ("DistNetworkError", "DistTimeoutError"), report
        assert re.search(r"\brank \d", e["msg"]), report
        assert ended[r] < timeout_ms / 1000 + 10, report
        assert e["transport"] == "shm+tcp", report
    for h in hosts.names:
        assert hosts.shm_files(h) == [], f"{h}: {hosts.shm_files(h)} left in /dev/shm"


# --- a killed rank ends every other rank ---------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("victim", [1, 2], ids=["host_a_local1", "host_b_local0"])
def test_killed_rank_ends_every_other_rank(ranks, hosts, victim):
    timeout_ms = 6000
    env = {"SYNC": ranks.tmp_path, "DISTRIBUTED_TIMEOUT_MS": timeout_ms}
    procs = start(ranks, hosts, CUT, env)
    wait_files([ranks.tmp_path / f"ready.{r}" for r in range(WORLD)], procs, 40)
    time.sleep(0.3)                                   # inside the loop of all_reduces
    ranks.kill(procs[victim])
    results = ranks.wait([p for p in procs if p.rank != victim], timeout=timeout_ms / 1000 + 10)
    report = ranks.report(results)[-6000:]
    assert all(r.rc == 3 for r in results), report
    for e in records(results, "ERROR"):
        assert e["dist"] and e["cls"] in ("DistNetworkError", "DistTimeoutError"), report
        assert re.search(rf"\brank {victim}\b", e["msg"]) and e["transport"] == "shm+tcp", report
    for h in hosts.names:
        assert hosts.shm_files(h) == [], f"{h}: {hosts.shm_files(h)} left in /dev/shm"


# --- CYXWIZ_TRANSPORT=shm insists: hosts that cannot share are an error at init -------------------------

INIT = r'''
import json, sys
import pycyxwiz as cx
try:
    cx.distributed.init()
except Exception as e:
    print("INIT_ERROR " + json.dumps({"cls": type(e).__name__, "msg": str(e)}), flush=True)
    sys.exit(3)
print("INIT_OK " + json.dumps({"transport": cx.distributed.get_config().transport}), flush=True)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", [(0, 0, 1), (0, 1)], ids=["uneven", "1per_host"])
def test_shm_setting_raises_where_hosts_cannot_share(ranks, hosts, layout):
    results = ranks.wait(start(ranks, hosts, INIT, {"CYXWIZ_TRANSPORT": "shm"}, layout=layout), timeout=30)
    report = ranks.report(results)[-6000:]
    assert all(r.rc == 3 for r in results), report
    for r, e in enumerate(records(results, "INIT_ERROR")):
        assert e["cls"] == "ValueError" and e["msg"].startswith(f"[rank {r}/{len(layout)}] init: CYXWIZ_TRANSPORT=shm"), report


# --- the ring between hosts times its own waits --------------------------------------------------

LATE = r'''
import json, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
r = D.get_rank()
D.barrier()
# Rank 1 keeps rank 0 in the shared-memory phase for 0.7 timeouts; host B comes 1.2 timeouts late.
# No rank then waits for another for a whole timeout, so the call must succeed.
time.sleep({1: 0.7, 2: 1.2, 3: 1.2}.get(r, 0.0) * TIMEOUT_S)
x = np.full(1 << 18, r + 1, np.float32)
t = time.monotonic()
D.all_reduce(x)
print("RESULT " + json.dumps({"rank": r, "ok": bool((x == 10).all()), "s": time.monotonic() - t}), flush=True)
D.finalize()
'''


@pytest.mark.timeout(60)
def test_ring_between_hosts_counts_its_timeout_from_its_first_wait(ranks, hosts):
    """Rank 0 spends 0.7 timeouts in the shared-memory phase, then waits 0.5 timeouts for host B: the
    ring between hosts must not count the first 0.7 against its own wait (its first send, the call
    header, restarts its clock: tcp/duplex.h)."""
    timeout_ms = 3000
    code = LATE.replace("TIMEOUT_S", str(timeout_ms / 1000))
    results = ranks.wait(start(ranks, hosts, code, {"DISTRIBUTED_TIMEOUT_MS": str(timeout_ms)}), timeout=45)
    report = ranks.report(results)[-6000:]
    assert all(r.rc == 0 for r in results), report
    assert all(rep["ok"] for rep in records(results, "RESULT")), report
