"""Strangers on a job's ports: what is bound where, a connection flood on rank 0, silent connections on
a rank's ring port, and a stranger filling rank 0's store.

Every test runs a real job on 127.0.0.1 and checks its all_reduce against numpy (check_job), so a
stranger that disturbs the job fails the test.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import pytest

from test_rendezvous import FAILING_INIT, JOB, check_job, connect, hello, last_json, read_until_closed, wait_files

# Binds, joins, waits for the test, then reports what it cost: wall time and CPU time of init() and
# of the seconds after it (the flood is still there), as getrusage of the whole process measures it.
MEASURED_JOB = r'''
import resource, os
limit = int(os.environ.get("TEST_NOFILE", "0"))
if limit:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
''' + JOB.replace("t0 = time.monotonic()\ndist.init()", r'''
t0 = time.monotonic()
u0 = resource.getrusage(resource.RUSAGE_SELF)
dist.init()
''').replace("dist.finalize()\n", r'''
if os.environ.get("TEST_IDLE_S"):
    time.sleep(float(os.environ["TEST_IDLE_S"]))
u1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (u1.ru_utime + u1.ru_stime) - (u0.ru_utime + u0.ru_stime)
wall = time.monotonic() - t0
dist.finalize()
(HERE / f"cost{RANK}.json").write_text(json.dumps(dict(cpu=cpu, wall=wall)))
''')


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(ip, port) of every listening TCP socket of process `pid`, read from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                ip_hex, port_hex = local.split(":")
                if len(ip_hex) == 8:
                    ip = socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16)))
                else:
                    ip = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(ip_hex))
                found.append((ip, int(port_hex, 16)))
    return found


def external_ip() -> str | None:
    """An address of this machine that is not loopback (the one a default route would use), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent for a UDP connect
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def ring_port_of(proc, count=1) -> list[tuple[str, int]]:
    """The listeners of a rank that waits in init() for a missing rank (rank 0: its rendezvous and
    ring port; the others: their ring port), once it has opened them."""
    deadline = time.monotonic() + 30
    while True:
        found = listening_addresses(proc.pid)
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline and proc.poll() is None, f"rank {proc.rank} opened {found}"
        time.sleep(0.05)


def test_a_loopback_job_listens_on_loopback_only(ranks):
    procs = ranks.start(JOB, 3, ranks=[0, 1])
    bound = {0: ring_port_of(procs[0], 2), 1: ring_port_of(procs[1], 1)}
    procs += ranks.start(JOB, 3, ranks=[2])
    check_job(ranks, ranks.wait(procs, timeout=60), 3)
    assert len(bound[0]) == 2 and ("127.0.0.1", ranks.port) in bound[0] and len(bound[1]) == 1, bound
    for rank, addresses in bound.items():
        for ip, port in addresses:
            assert ip == "127.0.0.1", f"rank {rank} listens on {ip}:{port} in a job on 127.0.0.1: {bound}"


def test_the_rendezvous_of_a_loopback_job_cannot_be_reached_from_outside(ranks):
    ip = external_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback address to try")
    procs = ranks.start(FAILING_INIT, 2, ranks=[0], env={"DISTRIBUTED_TIMEOUT_MS": "4000"})
    connect(ranks.port).close()  # rank 0 serves
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ip, ranks.port), timeout=5).close()
    ranks.wait(procs, timeout=30)


def silent_flood(port: int, count: int, many_addresses: bool) -> list[socket.socket]:
    """`count` connections to 127.0.0.1:port that never say anything, from 127.0.0.1 or from
    127.0.0.2, 127.0.0.3, ... (every 127/8 address is this machine's)."""
    socks = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if many_addresses:
            s.bind((f"127.0.{(i + 2) // 250}.{(i + 2) % 250 + 1}", 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


@pytest.mark.parametrize("many_addresses", [False, True], ids=["one-address", "150-addresses"])
def test_a_connection_flood_on_rank_0_neither_blocks_the_job_nor_spins(ranks, many_addresses):
    """150 silent connections against rank 0 limited to 100 descriptors: the job forms within a few
    seconds, and rank 0 spends little CPU time while the flood is there."""
    env = {"TEST_IDLE_S": "2", "DISTRIBUTED_TIMEOUT_MS": "20000"}
    procs = ranks.start(MEASURED_JOB, 2, ranks=[0], env={**env, "TEST_NOFILE": "100"})
    connect(ranks.port).close()  # rank 0 serves
    flood = silent_flood(ranks.port, 150, many_addresses)
    try:
        started = time.monotonic()
        procs += ranks.start(MEASURED_JOB, 2, ranks=[1], env=env)
        wait_files(ranks.tmp_path, ["formed0", "formed1"], timeout=30, procs=procs)
        formed_after = time.monotonic() - started
        results = ranks.wait(procs, timeout=60)
    finally:
        for s in flood:
            s.close()
    check_job(ranks, results, 2)
    assert formed_after < 6, f"the job formed {formed_after:.1f} s after rank 1 started"
    cost = json.loads((ranks.tmp_path / "cost0.json").read_text())
    assert cost["cpu"] < 0.35 * cost["wall"], f"rank 0 used {cost['cpu']:.2f} s of CPU in {cost['wall']:.2f} s"
    err0 = next(r.err for r in results if r.rank == 0)
    assert "rendezvous: " in err0 and "127.0." in err0, err0  # the strangers were logged


RING_STRANGER_LOG = "[pycyxwiz rank 1/3] WARNING: init: ring port: refused a connection from 127.0.0.1"


def test_silent_connections_on_a_ring_port_do_not_fail_the_job(ranks):
    """Strangers that connect to rank 1's ring port and say nothing (or nonsense) before rank 0 dials
    it: the job forms all the same, well before the timeout."""
    env = {"DISTRIBUTED_TIMEOUT_MS": "10000"}
    procs = ranks.start(JOB, 3, ranks=[0, 1], env=env)
    # Rank 1 opens its ring port, publishes it, and waits for rank 2 to publish its own.
    [(ip, port)] = ring_port_of(procs[1])
    strangers = [connect(port) for _ in range(5)]
    strangers[3].sendall(b"GET / HTTP/1.1\r\n\r\n")
    strangers[4].sendall(hello("someone-else", 3, 0, channel=3))
    try:
        started = time.monotonic()
        procs += ranks.start(JOB, 3, ranks=[2], env=env)
        results = ranks.wait(procs, timeout=60)
        finished_after = time.monotonic() - started
    finally:
        for s in strangers:
            s.close()
    check_job(ranks, results, 3)
    assert finished_after < 8, f"the job took {finished_after:.1f} s after rank 2 started"
    err1 = next(r.err for r in results if r.rank == 1)
    assert any(line.startswith(RING_STRANGER_LOG) and "another job" in line for line in err1.splitlines()), err1
    assert any(line.startswith(RING_STRANGER_LOG) and "GET / HTTP" in line for line in err1.splitlines()), err1


def store_request(s: socket.socket, op: int, key: bytes, value: bytes) -> tuple[int, bytes]:
    """One store request (16-byte frame: op, kind, pad, key length, value length) and its reply."""
    s.sendall(struct.pack("<BBHIQ", op, 0, 0, len(key), len(value)) + key + value)
    head = b""
    while len(head) < 16:
        chunk = s.recv(16 - len(head))
        assert chunk, "rank 0 closed the connection"
        head += chunk
    status, _, _, _, length = struct.unpack("<BBHIQ", head)
    payload = b""
    while len(payload) < length:
        chunk = s.recv(min(1 << 20, length - len(payload)))
        assert chunk, "rank 0 closed the connection"
        payload += chunk
    return status, payload


SET = 1


def test_rank_0s_store_has_a_quota(ranks):
    """A stranger posing as rank 1 of a job without a secret cannot make rank 0 hold more than the
    quota: a value over 16 MiB, and more than 64 MiB in all, are refused with a reason; the job forms."""
    procs = ranks.start(JOB, 2, ranks=[0])
    s = connect(ranks.port)
    s.sendall(hello(""))
    assert s.recv(8) == bytes(8)  # welcome: no secret, so anyone may take a free seat
    status, reason = store_request(s, SET, b"big", bytes((16 << 20) + 1))
    assert status != 0 and b"16 MiB" in reason and b"quota" in reason, reason
    accepted = 0
    for i in range(12):
        status, reason = store_request(s, SET, f"k{i}".encode(), bytes(16 << 20))
        if status != 0:
            break
        accepted += 1
    assert accepted == 3, f"rank 0 stored {accepted} values of 16 MiB"  # 4 x 16 MiB = the whole 64 MiB, with the keys
    assert b"64 MiB" in reason and b"quota" in reason and b"CYXWIZ_SECRET" in reason, reason
    s.close()
    procs += ranks.start(JOB, 2, ranks=[1])
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 2)
    err0 = next(r.err for r in results if r.rank == 0)
    assert "rank 1 (127.0.0.1:" in err0 and "quota" in err0, err0


# A fake rank 0: welcomes every hello, then answers the first store request with an error.
def test_a_store_error_reply_raises_dist_store_error_naming_rank_0(ranks):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", ranks.port))
        server.listen(8)
        server.settimeout(20)
        [proc] = ranks.start(FAILING_INIT, 2, ranks=[1], env={"DISTRIBUTED_TIMEOUT_MS": "8000"})
        conns = []
        try:
            for _ in range(2):  # the store connection, then the monitor
                conn, _ = server.accept()
                conn.settimeout(10)
                got = b""
                while len(got) < 40:
                    got += conn.recv(40 - len(got))
                conn.sendall(bytes(8))
                conns.append(conn)
            head = conns[0].recv(16)
            assert len(head) == 16, head
            message = b"the store is full"
            conns[0].sendall(struct.pack("<BBHIQ", 1, 0, 0, 0, len(message)) + message)
            [result] = ranks.wait([proc], timeout=30)
        finally:
            for conn in conns:
                conn.close()
    out = last_json(result)
    assert out["type"] == "DistStoreError", out
    assert f"127.0.0.1:{ranks.port}" in out["message"] and "the store is full" in out["message"], out
    assert out["elapsed"] < 6, out


CHECK = 3


def test_pipelined_requests_cost_linear_time(ranks):
    """500000 requests sent at once (a stranger in a job without a secret, or a busy client): rank 0
    answers them all within a few seconds, in order, and the job forms after."""
    procs = ranks.start(JOB, 2, ranks=[0])
    s = connect(ranks.port)
    s.sendall(hello(""))
    assert s.recv(8) == bytes(8)
    count = 500_000
    request = struct.pack("<BBHIQ", CHECK, 0, 0, 1, 0) + b"k"
    sender = threading.Thread(target=s.sendall, args=(request * count,))
    started = time.monotonic()
    sender.start()
    expected = (struct.pack("<BBHIQ", 0, 0, 0, 0, 1) + b"0") * count
    got = bytearray()
    s.settimeout(60)
    try:
        while len(got) < len(expected):
            chunk = s.recv(1 << 20)
            assert chunk, "rank 0 closed the connection"
            got += chunk
    finally:
        sender.join(timeout=30)
    took = time.monotonic() - started
    s.close()
    assert bytes(got) == expected
    assert took < 10, f"{count} pipelined requests took {took:.1f} s"
    procs += ranks.start(JOB, 2, ranks=[1])
    check_job(ranks, ranks.wait(procs, timeout=60), 2)


# Joins, then takes every file descriptor it may open and holds them while the test connects:
# rank 0's rendezvous can accept nothing. Reports the CPU time it used meanwhile.
HOG_JOB = r'''
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
''' + JOB.replace("(HERE / f\"formed{RANK}\").write_text(\"1\")\n", r'''
(HERE / f"formed{RANK}").write_text("1")
if RANK == 0:
    hog = []
    try:
        while True:
            hog.append(open(os.devnull))
    except OSError:
        hog.pop().close()  # one for the file below
    (HERE / "hogging").write_text("1")
    hog.append(open(os.devnull))
    u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    wait_for_go()
    u1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    for f in hog:
        f.close()
    cpu = (u1.ru_utime + u1.ru_stime) - (u0.ru_utime + u0.ru_stime)
    (HERE / "cost0.json").write_text(json.dumps(dict(cpu=cpu, wall=t1 - t0)))
else:
    wait_for_go()
''')


def test_rank_0_out_of_descriptors_sheds_connections_without_spinning(ranks):
    procs = ranks.start(HOG_JOB, 2)
    wait_files(ranks.tmp_path, ["formed0", "formed1", "hogging"], procs=procs)
    closed = 0
    for _ in range(20):
        with connect(ranks.port) as s:
            s.settimeout(5)
            closed += read_until_closed(s) == b""  # accepted and closed at once: no descriptor to keep it
    time.sleep(2)
    (ranks.tmp_path / "go").write_text("1")
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 2)
    assert closed == 20
    cost = json.loads((ranks.tmp_path / "cost0.json").read_text())
    assert cost["cpu"] < 0.35 * cost["wall"], f"rank 0 used {cost['cpu']:.2f} s of CPU in {cost['wall']:.2f} s"
    err0 = next(r.err for r in results if r.rank == 0)
    assert "no file descriptor left" in err0, err0


def test_a_client_that_never_reads_its_answers_is_closed(ranks):
    """Requests whose answers are never read pile up on rank 0: past 32 MiB it closes the
    connection (a rank reads each answer before it asks again); the job forms after."""
    procs = ranks.start(JOB, 2, ranks=[0])
    s = connect(ranks.port, rcvbuf=4096)  # keep the answers on rank 0's side
    s.sendall(hello(""))
    assert s.recv(8) == bytes(8)
    request = (struct.pack("<BBHIQ", CHECK, 0, 0, 1, 0) + b"k") * 100_000
    s.settimeout(30)
    closed = False
    try:
        for _ in range(40):  # 4 million requests: 68 MB of answers
            s.sendall(request)
        time.sleep(1)  # rank 0 reads what the kernel buffered
        s.sendall(request)
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    finally:
        s.close()
    assert closed, "rank 0 kept accepting requests whose answers nobody read"
    procs += ranks.start(JOB, 2, ranks=[1])
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 2)
    assert "MiB of answers unread" in next(r.err for r in results if r.rank == 0)
