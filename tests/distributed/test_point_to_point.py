"""cx.distributed.send / recv between real processes on 127.0.0.1.

Every payload is a pure function of (sender, receiver, tag, index), so a receiver checks the bytes it
got against what the sender must have sent (numpy is the oracle). Covered: a ring exchange where
every rank sends before it receives (large enough to fill the kernel's socket buffers: the eager
protocol must not deadlock), tags out of order, several messages per tag kept in order, recv from any
rank, a message that arrives before its recv, size mismatch, a recv nobody answers (timeout), a peer
that dies while another waits, strangers on the port that point-to-point keeps open after init.
"""

from __future__ import annotations

import json

import pytest

PRELUDE = r'''
import json, os, sys, time
import numpy as np
import pycyxwiz as cx

dist = cx.distributed
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
errors = []
checks = [0]


def expect(cond, message):
    checks[0] += 1
    if not cond:
        errors.append(str(message))


def payload(src, dst, tag, i, n, dtype="float32"):
    rng = np.random.default_rng([src, dst, tag + 1000, i])
    if dtype.startswith("int"):
        return rng.integers(-2**30, 2**30, size=n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def done():
    print("REPORT " + json.dumps({"rank": RANK, "errors": errors, "checks": checks[0]}), flush=True)
    dist.finalize()
'''


def reports(results):
    out = {}
    for r in results:
        for line in r.out.splitlines():
            if line.startswith("REPORT "):
                out[r.rank] = json.loads(line[len("REPORT "):])
    return out


def check(ranks, results, world_size, min_checks=1):
    got = reports(results)
    assert sorted(got) == list(range(world_size)) and all(r.rc == 0 for r in results), ranks.report(results)
    for rank, rep in got.items():
        assert rep["errors"] == [], f"rank {rank}: {rep['errors']}"
        assert rep["checks"] >= min_checks, f"rank {rank} checked only {rep['checks']} things"


@pytest.mark.parametrize("world_size", [2, 3])
def test_exchange_in_a_ring_with_sends_first(ranks, world_size):
    """Every rank sends 8 MiB to its right neighbour and then receives from its left one, blocking:
    with a rendezvous protocol this would deadlock (every socket buffer full); the eager one may not.
    Also: two tags out of order, several messages per tag in order, int64 and float64 payloads."""
    code = PRELUDE + r'''
dist.init()
right, left = (RANK + 1) % WS, (RANK - 1) % WS
big = payload(RANK, right, 0, 0, 2 * 1024 * 1024)
dist.send(big, right)                          # blocking: returns once the bytes are on their way
got = np.zeros_like(big)
src = dist.recv(got, left)
expect(src == left, f"recv said the message came from {src}, expected {left}")
expect(np.array_equal(got, payload(left, RANK, 0, 0, got.size)), "8 MiB ring message differs")

# Tags: send tag 7 then tag 3; the receiver asks for tag 3 first.
for tag in (7, 3):
    for i in range(3):
        dist.send(payload(RANK, right, tag, i, 1000 + i, "int64"), right, tag=tag)
for tag in (3, 7):
    for i in range(3):
        buf = np.empty(1000 + i, dtype="int64")
        dist.recv(buf, left, tag=tag)
        expect(np.array_equal(buf, payload(left, RANK, tag, i, 1000 + i, "int64")), f"tag {tag} message {i} differs")

# Asynchronous both ways, float64, waited in reverse order.
rbuf = np.empty(5000)
rw = dist.recv(rbuf, left, tag=11, async_op=True)
sw = dist.send(payload(RANK, right, 11, 0, 5000, "float64"), right, tag=11, async_op=True)
expect(rw.wait() and sw.wait(), "wait() did not return True")
expect(rw.source_rank == left, f"source_rank {rw.source_rank}")
expect(np.array_equal(rbuf, payload(left, RANK, 11, 0, 5000, "float64")), "async message differs")
dist.barrier()
done()
'''
    results = ranks.run(code, world_size, timeout=90)
    check(ranks, results, world_size, min_checks=8)


def test_recv_from_any_rank_and_early_messages(ranks):
    """Rank 0 receives from whichever rank sends first, three times; ranks 1 and 2 send before rank 0
    posts its recvs (they wait at a barrier first, so the messages are in before rank 0 asks)."""
    code = PRELUDE + r'''
dist.init()
if RANK == 0:
    dist.barrier()
    time.sleep(0.3)  # the messages are in before any recv is posted
    seen = []
    for _ in range(2):
        buf = np.empty(100, dtype="float32")
        src = dist.recv(buf)  # any rank
        seen.append(src)
        expect(np.array_equal(buf, payload(src, 0, 0, 0, 100)), f"any-source message from {src} differs")
    expect(sorted(seen) == [1, 2], f"sources {seen}")
    buf = np.empty(10, dtype="float32")
    w = dist.recv(buf, None, tag=5, async_op=True)
    dist.barrier()
    w.wait()
    expect(w.source_rank == 2 and np.array_equal(buf, payload(2, 0, 5, 0, 10)), f"tag 5 from {w.source_rank}")
else:
    dist.send(payload(RANK, 0, 0, 0, 100), 0)
    dist.barrier()
    if RANK == 2:
        dist.send(payload(2, 0, 5, 0, 10), 0, tag=5)
    dist.barrier()
done()
'''
    results = ranks.run(code, 3, timeout=60)
    check(ranks, results, 3, min_checks=0)
    assert reports(results)[0]["checks"] == 4


def test_errors_name_the_peer_and_the_remedy(ranks):
    """A size mismatch fails that recv only (the link stays usable); a recv nobody answers times out
    naming the peer, the tag and the remedy; bad peers are refused."""
    code = PRELUDE + r'''
dist.init()
if RANK == 0:
    dist.send(np.arange(10, dtype="float32"), 1)
    dist.send(np.arange(4, dtype="float32"), 1, tag=1)
else:
    buf = np.empty(20, dtype="float32")
    try:
        dist.recv(buf, 0)
        expect(False, "a size mismatch was not refused")
    except dist.DistBackendError as e:
        expect("rank 0 (127.0.0.1:" in str(e) and "40 bytes" in str(e) and "80" in str(e), f"mismatch message: {e}")
    buf = np.empty(4, dtype="float32")
    dist.recv(buf, 0, tag=1)
    expect(np.array_equal(buf, np.arange(4, dtype="float32")), "the link was not usable after a mismatch")
    t0 = time.monotonic()
    try:
        dist.recv(buf, 0, tag=99)
        expect(False, "a recv nobody answers returned")
    except dist.DistTimeoutError as e:
        s = str(e)
        expect("recv" in s and "tag 99" in s and "rank 0 (127.0.0.1:" in s and "DISTRIBUTED_TIMEOUT_MS" in s, f"timeout: {s}")
    expect(time.monotonic() - t0 < 15, "the recv waited far past the timeout")
for bad in (RANK, WS, -1):
    try:
        dist.send(np.zeros(1, dtype="float32"), bad)
        expect(False, f"send to {bad} accepted")
    except ValueError as e:
        expect("is not another rank" in str(e), f"send to {bad}: {e}")
dist.barrier()
done()
'''
    # Rank 1's timeout is short (its recv waits for it); rank 0 waits at the barrier meanwhile.
    results = ranks.run(code, 2, timeout=60, rank_env={1: {"DISTRIBUTED_TIMEOUT_MS": "3000"}})
    check(ranks, results, 2, min_checks=3)
    assert reports(results)[1]["checks"] == 7


def test_a_dead_sender_fails_the_waiting_recv(ranks):
    """Rank 1 dies (SIGKILL) after its first message; rank 0, waiting for a second one, fails within
    the timeout with an error that names rank 1, instead of hanging."""
    code = PRELUDE + r'''
import signal
dist.init()
if RANK == 1:
    dist.send(np.ones(10, dtype="float32"), 0)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
buf = np.empty(10, dtype="float32")
dist.recv(buf, 1)
t0 = time.monotonic()
try:
    dist.recv(buf, 1)
    expect(False, "a recv from a dead rank returned")
except dist.DistError as e:
    expect("rank 1" in str(e), f"error does not name rank 1: {e}")
    print("ERROR", type(e).__name__, e, flush=True)
expect(time.monotonic() - t0 < 25, "noticed only after the timeout")
print("REPORT " + json.dumps({"rank": RANK, "errors": errors, "checks": checks[0]}), flush=True)
'''
    results = ranks.run(code, 2, timeout=60, env={"DISTRIBUTED_TIMEOUT_MS": "20000"})
    got = reports(results)
    assert 0 in got and results[0].rc == 0, ranks.report(results)
    assert got[0]["errors"] == [] and got[0]["checks"] >= 2, got[0]
    assert results[1].rc == -9, ranks.report(results)


def test_strangers_on_the_ring_port_after_init(ranks, tmp_path):
    """Rank 1 connects garbage and a silent socket to rank 0's ring port after init (its address is
    in the store), then the ranks exchange messages: both arrive, the strangers are closed."""
    code = PRELUDE + r'''
import socket
if RANK == 0:
    open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
dist.init()
if RANK == 1:
    # Rank 0's ring port: the peer address rank 1's own ring link to rank 0 came from is not exposed, so
    # find it the way an attacker on the host would: try the listening TCP ports of rank 0's process.
    pid0 = int(open(os.environ["PID_FILE"]).read())
    inodes = set()
    for fd in os.listdir(f"/proc/{pid0}/fd"):
        try:
            link = os.readlink(f"/proc/{pid0}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # LISTEN
            ports.append(int(f[1].split(":")[1], 16))
    expect(len(ports) >= 1, f"no listening port of rank 0 found")
    strangers = []
    for p in ports:
        s = socket.create_connection(("127.0.0.1", p))
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        strangers.append(s)
        strangers.append(socket.create_connection(("127.0.0.1", p)))  # silent
    dist.send(np.arange(1000, dtype="int64"), 0, tag=2)
    dist.barrier()
    for s in strangers:
        s.close()
else:
    buf = np.empty(1000, dtype="int64")
    dist.recv(buf, 1, tag=2)
    expect(np.array_equal(buf, np.arange(1000)), "message after strangers differs")
    dist.barrier()
done()
'''
    pid_file = tmp_path / "pid0"
    results = ranks.run(code, 2, timeout=60, env={"PID_FILE": str(pid_file)})
    check(ranks, results, 2, min_checks=1)
    assert "WARNING: ring port: " in results[0].err, ranks.report(results)


@pytest.mark.parametrize("world_size", [2, 3])
def test_gather_scatter_all_to_all_against_numpy(ranks, world_size):
    """The collectives that travel over point-to-point links, with numpy as the oracle: gather to each
    root, scatter from each root, all_to_all with equal and uneven splits (some empty), async ones
    interleaved with ring collectives in issue order."""
    code = PRELUDE + r'''
dist.init()
for root in range(WS):
    mine = payload(RANK, root, 20, 0, 6).reshape(2, 3)
    got = dist.gather(mine, dst=root)
    if RANK == root:
        expect(len(got) == WS and all(np.array_equal(got[r], payload(r, root, 20, 0, 6).reshape(2, 3)) for r in range(WS)),
               f"gather to {root}")
    else:
        expect(got is None, f"gather returned {got!r} on a rank that is not dst")
    out = np.empty(5, dtype="int64")
    parts = [payload(root, r, 21, 0, 5, "int64") for r in range(WS)] if RANK == root else None
    dist.scatter(out, parts, src=root)
    expect(np.array_equal(out, payload(root, RANK, 21, 0, 5, "int64")), f"scatter from {root}")

# Equal splits: rows 2 per rank, 4 columns.
inp = np.stack([payload(RANK, r, 22, i, 4) for r in range(WS) for i in range(2)])
out = np.empty_like(inp)
dist.all_to_all(inp, out)
want = np.stack([payload(r, RANK, 22, i, 4) for r in range(WS) for i in range(2)])
expect(np.array_equal(out, want), "all_to_all equal splits")

# Uneven: rank s sends (s + r) % 3 rows to rank r.
rows = lambda s, r: (s + r) % 3
inp = np.concatenate([payload(RANK, r, 23, 0, rows(RANK, r) * 2).reshape(-1, 2) for r in range(WS)])
out = np.empty((sum(rows(s, RANK) for s in range(WS)), 2), dtype="float32")
w = dist.all_to_all(inp, out, [rows(RANK, r) for r in range(WS)], [rows(s, RANK) for s in range(WS)], async_op=True)
acc = np.full(3, float(RANK + 1))
dist.all_reduce(acc)  # a ring collective after the async one: issue order holds
w.wait()
want = np.concatenate([payload(s, RANK, 23, 0, rows(s, RANK) * 2).reshape(-1, 2) for s in range(WS)])
expect(np.array_equal(out, want), "all_to_all uneven splits")
expect(np.array_equal(acc, np.full(3, WS * (WS + 1) / 2)), "all_reduce after all_to_all")
done()
'''
    results = ranks.run(code, world_size, timeout=90)
    check(ranks, results, world_size, min_checks=2 * world_size + 3)


def test_collectives_over_links_refuse_mismatches(ranks):
    """Ranks that disagree get an error naming the other rank's call, not each other's bytes: split
    sizes that do not match, and gather on one rank against scatter on the other (where neither
    rank receives a message from the other: the ring's header step sees it)."""
    code = PRELUDE + r'''
dist.init()
inp = np.zeros((4, 2), dtype="float32")
out = np.zeros((4, 2), dtype="float32")
try:
    # Rank 0 expects 2 rows from rank 1; rank 1 sends 3.
    dist.all_to_all(inp, out, [2, 2] if RANK == 0 else [3, 1], [2, 2] if RANK == 0 else [3, 1])
    expect(False, "mismatched splits were not refused")
except dist.DistError as e:
    print("ERR", e, flush=True)
    expect("all_to_all" in str(e), f"message: {e}")
print("REPORT " + json.dumps({"rank": RANK, "errors": errors, "checks": checks[0]}), flush=True)
'''
    results = ranks.run(code, 2, timeout=60, env={"DISTRIBUTED_TIMEOUT_MS": "5000"})
    got = reports(results)
    assert sorted(got) == [0, 1], ranks.report(results)
    assert all(rep["errors"] == [] and rep["checks"] == 1 for rep in got.values()), ranks.report(results)
    assert "rank 1 (127.0.0.1:" in results[0].out and "24 bytes" in results[0].out, ranks.report(results)

    code = PRELUDE + r'''
dist.init()
buf = np.zeros(4, dtype="float32")
try:
    if RANK == 0:
        dist.gather(buf, dst=1)
    else:
        dist.scatter(buf, [buf, buf], src=1)
    expect(False, "gather against scatter was not refused")
except dist.DistError as e:
    print("ERR", e, flush=True)
    expect("mismatch with rank" in str(e), f"message: {e}")
print("REPORT " + json.dumps({"rank": RANK, "errors": errors, "checks": checks[0]}), flush=True)
'''
    results = ranks.run(code, 2, timeout=60, env={"DISTRIBUTED_TIMEOUT_MS": "5000"})
    got = reports(results)
    assert sorted(got) == [0, 1], ranks.report(results)
    assert all(rep["errors"] == [] for rep in got.values()), ranks.report(results)
    assert "which called scatter #2" in results[0].out + results[1].out, ranks.report(results)
