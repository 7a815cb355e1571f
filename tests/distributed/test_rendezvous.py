"""Joining a job: start order, a busy port, strangers on rank 0's port, another job, a duplicate
rank, ranks that never come, two jobs side by side, and a world of one that needs no port.

Rank scripts that must stay in the job while the test does something write `formed<rank>` once
init() returns and wait for a `go` file before their collective; the test creates it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

import numpy as np
from harness import free_port

COMMON = r'''
import json, os, sys, time
from pathlib import Path
import numpy as np
import pycyxwiz as cx
dist = cx.distributed
HERE = Path(__file__).resolve().parent
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
SEED = int(os.environ.get("TEST_SEED", "0"))


def data(rank):
    return np.random.default_rng([SEED, rank]).standard_normal(5000).astype(np.float32)


def wait_for_go():
    deadline = time.time() + 45
    while not (HERE / "go").exists():
        if time.time() > deadline:
            sys.exit(f"rank {RANK}: no go file")
        time.sleep(0.05)
'''

# Joins, optionally waits for the test, does one all_reduce and a MAX, reports.
JOB = COMMON + r'''
t0 = time.monotonic()
dist.init()
joined = time.monotonic() - t0
(HERE / f"formed{RANK}").write_text("1")
if os.environ.get("TEST_WAIT_FOR_GO"):
    wait_for_go()
x = data(RANK)
dist.all_reduce(x)
m = np.array([RANK * 10 + SEED], dtype=np.int64)
dist.all_reduce(m, op=dist.ReduceOp.MAX)
dist.finalize()
print(json.dumps(dict(rank=RANK, x=x.tolist(), max=int(m[0]), joined=joined)))
'''

# Expects init() to fail; reports how.
FAILING_INIT = COMMON + r'''
t0 = time.monotonic()
try:
    dist.init()
except Exception as e:  # noqa: BLE001 - the test checks the type
    print(json.dumps(dict(rank=RANK, type=type(e).__name__, message=str(e), elapsed=time.monotonic() - t0,
                          mro=[c.__name__ for c in type(e).__mro__], initialized=dist.is_initialized())))
    sys.exit(0)
print(json.dumps(dict(rank=RANK, type=None, message="init() succeeded", elapsed=time.monotonic() - t0)))
dist.finalize()
sys.exit(3)
'''


def last_json(result) -> dict:
    lines = result.out.strip().splitlines()
    assert lines, f"rank {result.rank} printed nothing (rc={result.rc})\n{result.err}"
    return json.loads(lines[-1])


def check_job(ranks, results, world_size, seed=0):
    """Every rank exited 0 with the all_reduce SUM/MAX that numpy computes from every rank's data."""
    assert sorted(r.rank for r in results) == list(range(world_size))
    assert all(r.rc == 0 for r in results), ranks.report(results)
    outs = {r.rank: last_json(r) for r in results}
    inputs = [np.random.default_rng([seed, r]).standard_normal(5000).astype(np.float32) for r in range(world_size)]
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    bound = 2 * world_size * np.finfo(np.float32).eps * np.sum(np.abs(np.stack(inputs)).astype(np.float64), axis=0)
    for r, out in outs.items():
        got = np.array(out["x"], dtype=np.float32)
        assert np.all(np.abs(got.astype(np.float64) - exact) <= bound), f"rank {r}: wrong sum"
        assert out["x"] == outs[0]["x"], f"rank {r} ended with other bits than rank 0"
        assert out["max"] == (world_size - 1) * 10 + seed
    return outs


def wait_files(directory: Path, names, timeout=40.0, procs=()):
    deadline = time.monotonic() + timeout
    while not all((directory / n).exists() for n in names):
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"rank {dead[0].rank} exited early (rc={dead[0].returncode}): {dead[0].communicate()}"
        assert time.monotonic() < deadline, f"waiting for {names}"
        time.sleep(0.05)


def fnv1a(text: str) -> int:
    h = 1469598103934665603
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) % 2**64
    return h


def hello(job_id="", world_size=2, rank=1, channel=1, version=2, magic=b"CYXWIZRV", generation=1) -> bytes:
    """The 40-byte hello: magic, version, channel (1 store, 2 monitor), flags, job-id hash, world size, rank,
    generation (which init() of the process), reserved."""
    return magic + struct.pack("<IHHQIIII", version, channel, 0, fnv1a(job_id), world_size, rank, generation, 0)


def connect(port, timeout=30.0, rcvbuf=None) -> socket.socket:
    """rcvbuf: a receive buffer set before connecting. Shrunk after the connection opened, the
    window already advertised outgrows it and the kernel drops the peer's segments, ACKs included:
    the connection stalls both ways."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if rcvbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            s.settimeout(15)
            return s
        except OSError:
            s.close()
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.05)


def read_until_closed(s: socket.socket) -> bytes:
    data = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data


def refusal(data: bytes) -> str:
    """The hello reply: status (0 = welcome), length, reason."""
    assert len(data) >= 8, data
    status, length = struct.unpack("<II", data[:8])
    assert status != 0 and length == len(data) - 8, data
    return data[8:].decode()


def test_ranks_started_in_reverse_order_form_the_job(ranks):
    procs = ranks.start(JOB, 3, ranks=[2])
    time.sleep(0.5)
    procs += ranks.start(JOB, 3, ranks=[1])
    time.sleep(2.5)  # ranks 1 and 2 retry rank 0's port until it comes
    procs += ranks.start(JOB, 3, ranks=[0])
    results = ranks.wait(procs, timeout=60)
    outs = check_job(ranks, results, 3)
    assert outs[2]["joined"] > 2.0, outs[2]["joined"]  # it really waited for rank 0


def test_busy_port_on_rank_0_raises_dist_network_error_at_once(ranks):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("0.0.0.0", ranks.port))
        holder.listen(8)
        holder.setblocking(False)
        [result] = ranks.run(FAILING_INIT, 2, ranks=[0])
        assert result.rc == 0, ranks.report([result])
        out = last_json(result)
        assert out["type"] == "DistNetworkError", out
        assert "ConnectionError" in out["mro"] and "DistError" in out["mro"]
        assert f"port {ranks.port}" in out["message"] and "Address already in use" in out["message"], out["message"]
        assert out["message"].startswith("[rank 0/2]"), out["message"]
        assert out["elapsed"] < 5, f"took {out['elapsed']:.1f} s with a 20 s timeout"
        assert out["initialized"] is False
        try:
            holder.accept()
            raise AssertionError("rank 0 connected to the process that holds its port")
        except BlockingIOError:
            pass


STRANGERS_LOG = "[pycyxwiz rank 0/2] WARNING: rendezvous: refused a connection from 127.0.0.1"


def test_strangers_during_and_after_rendezvous_are_refused_and_logged(ranks):
    port = ranks.port
    env = {"TEST_WAIT_FOR_GO": "1"}
    procs = ranks.start(JOB, 2, ranks=[0], env=env)
    kept_open = []

    # While rank 0 waits for rank 1.
    s = connect(port)
    s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_until_closed(s) == b""  # dropped without an answer
    s.close()
    rng = np.random.default_rng(1)
    s = connect(port)
    s.sendall(b"\x00\xff" + rng.bytes(62))
    assert read_until_closed(s) == b""
    s.close()
    for job_id, world_size, rank, version, reason in [
        ("someone-else", 2, 1, 2, "another job"),
        ("", 3, 1, 2, "world size 3"),
        ("", 2, 7, 2, "rank 7"),
        ("", 2, 1, 99, "version 99"),
    ]:
        s = connect(port)
        s.sendall(hello(job_id, world_size, rank, version=version))
        assert reason in refusal(read_until_closed(s))
        s.close()
    truncated = connect(port)
    truncated.sendall(hello()[:20])  # a good start, then silence
    silent = connect(port)  # never says anything
    opened = time.monotonic()
    kept_open += [truncated, silent]

    procs += ranks.start(JOB, 2, ranks=[1], env=env)
    # Silent connections are closed after min(timeout, 3 s): 3 s with DISTRIBUTED_TIMEOUT_MS=20000.
    for sock in kept_open:
        assert read_until_closed(sock) == b""
        sock.close()
    closed_after = time.monotonic() - opened
    assert 2.5 <= closed_after < 6, f"silent connections closed after {closed_after:.1f} s"
    wait_files(ranks.tmp_path, ["formed0", "formed1"], procs=procs)

    # After the job has formed.
    s = connect(port)
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    assert read_until_closed(s) == b""
    s.close()
    s = connect(port)
    s.sendall(hello("someone-else"))
    assert "another job" in refusal(read_until_closed(s))
    s.close()
    s = connect(port)
    s.sendall(hello(""))  # a second "rank 1" of this very job
    assert "already joined" in refusal(read_until_closed(s))
    s.close()

    (ranks.tmp_path / "go").write_text("1")
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 2)
    err0 = next(r.err for r in results if r.rank == 0)
    refused = [line for line in err0.splitlines() if line.startswith(STRANGERS_LOG)]
    assert len(refused) == 9, err0
    for text in ["'GET / HTTP/1.1\\r\\nHost: 12...'", "64 bytes 00 ff", "another job", "world size 3", "rank 7",
                 "version 99", "'GET /metrics HTTP/1.0", "already joined"]:
        assert any(text in line for line in refused), (text, err0)
    closed = [line for line in err0.splitlines()
              if line.startswith("[pycyxwiz rank 0/2] WARNING: rendezvous: closed a connection from 127.0.0.1")]
    assert len(closed) == 2 and all("within 3000 ms" in line for line in closed), err0
    assert any("sent nothing" in line for line in closed) and any("sent 20 bytes" in line for line in closed), err0
    err1 = next(r.err for r in results if r.rank == 1)
    assert "WARNING" not in err1, err1


def test_process_of_another_job_gets_dist_store_error(ranks):
    job = {"CYXWIZ_JOB_ID": "job-A"}
    procs = ranks.start(JOB, 2, ranks=[0], env=job)
    intruders = ranks.start(FAILING_INIT, 2, ranks=[1], env={"CYXWIZ_JOB_ID": "job-B"}, name="other_job.py")
    intruders += ranks.start(FAILING_INIT, 3, ranks=[1], env=job, name="other_world.py")
    intruders += ranks.start(FAILING_INIT, 2, ranks=[1], env={"CYXWIZ_JOB_ID": "<unset>", "TORCHELASTIC_RUN_ID": "job-C"},
                             name="torchelastic_job.py")
    found = ranks.wait(intruders, timeout=40)
    assert all(r.rc == 0 for r in found), ranks.report(found)
    outs = [last_json(r) for r in found]
    for out, reason, world_size in zip(outs, ["belongs to another job", "world size 3", "belongs to another job"], [2, 3, 2]):
        assert out["type"] == "DistStoreError", out
        assert out["message"].startswith(f"[rank 1/{world_size}]"), out["message"]
        assert "refused this rank" in out["message"] and reason in out["message"], out["message"]
        assert f"127.0.0.1:{ranks.port}" in out["message"], out["message"]
        assert out["elapsed"] < 15, out
    # The real job is unaffected.
    procs += ranks.start(JOB, 2, ranks=[1], env=job)
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 2)
    err0 = next(r.err for r in results if r.rank == 0)
    refused = [line for line in err0.splitlines() if line.startswith(STRANGERS_LOG)]
    assert len(refused) >= 3, err0


def test_duplicate_rank_gets_dist_store_error(ranks):
    env = {"TEST_WAIT_FOR_GO": "1", "CYXWIZ_JOB_ID": "dup-job"}
    procs = ranks.start(JOB, 3, env=env)
    wait_files(ranks.tmp_path, ["formed0", "formed1", "formed2"], procs=procs)
    dups = ranks.start(FAILING_INIT, 3, ranks=[1], env=env, name="dup1.py")
    dups += ranks.start(FAILING_INIT, 3, ranks=[2], env=env, name="dup2.py")
    found = ranks.wait(dups, timeout=40)
    assert all(r.rc == 0 for r in found), ranks.report(found)
    for r in found:
        out = last_json(r)
        assert out["type"] == "DistStoreError", out
        assert "already joined" in out["message"] and f"rank {r.rank}" in out["message"], out["message"]
        assert out["message"].startswith(f"[rank {r.rank}/3]"), out["message"]
        assert out["elapsed"] < 15, out
    (ranks.tmp_path / "go").write_text("1")
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 3)
    err0 = next(r.err for r in results if r.rank == 0)
    assert sum("already joined" in line for line in err0.splitlines() if line.startswith("[pycyxwiz rank 0/3] WARNING")) == 2, err0


def test_missing_ranks_time_out_naming_them(ranks):
    """Three broken jobs at once, DISTRIBUTED_TIMEOUT_MS=3000: rank 2 of 3 never comes; ranks 1 and 3
    of 4 never come; rank 0 of 2 never comes."""
    fast = {"DISTRIBUTED_TIMEOUT_MS": "3000"}
    port_b, port_c = free_port(), free_port()
    procs = ranks.start(FAILING_INIT, 3, ranks=[0, 1], env=fast, name="missing_one.py")
    procs += ranks.start(FAILING_INIT, 4, ranks=[0, 2], env={**fast, "MASTER_PORT": port_b}, name="missing_two.py")
    procs += ranks.start(FAILING_INIT, 2, ranks=[1], env={**fast, "MASTER_PORT": port_c}, name="no_rank0.py")
    results = ranks.wait(procs, timeout=60)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    outs = [last_json(r) for r in results]
    expected = [
        (0, 3, ["rank 2 of 3 did not join within 3000 ms"]),
        (1, 3, ["rank 2 of 3 did not join within 3000 ms"]),
        (0, 4, ["ranks 1, 3 of 4 did not join within 3000 ms"]),
        (2, 4, ["ranks 1, 3 of 4 did not join within 3000 ms"]),
        (1, 2, [f"Connection refused to 127.0.0.1:{port_c}", "within 3000 ms"]),
    ]
    for out, (rank, world_size, texts) in zip(outs, expected):
        assert out["rank"] == rank
        assert out["type"] == "DistTimeoutError" and "TimeoutError" in out["mro"], out
        message = out["message"]
        assert message.startswith(f"[rank {rank}/{world_size}]") and "Timeout waiting for peers" in message, message
        for text in texts:
            assert text in message, message
        # Rank 0 tells the others when its own wait ends, which reaches a rank that started later a
        # little before that rank's own deadline.
        assert 2.0 <= out["elapsed"] < 3 + 7, f"rank {rank}/{world_size} gave up after {out['elapsed']:.2f} s (DISTRIBUTED_TIMEOUT_MS=3000)"
        assert out["initialized"] is False


def test_two_jobs_on_different_ports_at_once(ranks):
    other_port = free_port()
    procs_a = ranks.start(JOB, 2, env={"TEST_SEED": 1}, name="job_a.py")
    procs_b = ranks.start(JOB, 3, env={"TEST_SEED": 2, "MASTER_PORT": other_port}, name="job_b.py")
    results = ranks.wait(procs_a + procs_b, timeout=60)
    check_job(ranks, results[:2], 2, seed=1)
    check_job(ranks, results[2:], 3, seed=2)


WORLD_OF_ONE = COMMON + r'''
dist.init()
cfg = dist.get_config()
x = data(0)
before = x.copy()
dist.all_reduce(x)
print(json.dumps(dict(world_size=dist.get_world_size(), port=cfg.master_port, identity=bool(np.array_equal(x, before)))))
dist.finalize()
'''


def test_world_of_one_needs_no_port(ranks):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("0.0.0.0", ranks.port))
        holder.listen(8)
        holder.setblocking(False)
        [result] = ranks.run(WORLD_OF_ONE, 1)
        assert result.rc == 0, ranks.report([result])
        assert last_json(result) == dict(world_size=1, port=ranks.port, identity=True)
        assert "WARNING" not in result.err, result.err
        try:
            holder.accept()
            raise AssertionError("a world of one connected to MASTER_PORT")
        except BlockingIOError:
            pass
