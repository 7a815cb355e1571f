"""Lengths that come from the wire: a process on MASTER_PORT that speaks the pycyxwiz hello and then
lies about a length must not make a rank allocate what it claims.

The liar is a real socket server in this test. The store test answers the hello itself (one small
helper, `answer_hello`, the only place that knows the handshake); the monitor test puts a proxy in
front of a real rank 0 and lies only after the real handshake went through it, so it knows nothing
of the handshake but which channel a connection opened. Each rank runs under an RLIMIT_AS of about
1 GiB above what it uses at start: a rank that believed an 8 GiB length would fail to allocate it
(or, without the limit, zero-fill it), a fixed rank refuses it at once with an error that names
the peer.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import pytest

from test_failures import watch  # noqa: F401  (watch: the fixture that reads rank output live)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux RLIMIT_AS and /proc")

FRAME = struct.Struct("<BBxxIQ")  # store request / reply / monitor notice header (wire.h: StoreFrame)
HELLO_BYTES, PROOF_BYTES, HAS_PROOF = 40, 48, 1

# Before init: cap the address space at what the process uses now plus 1 GiB.
LIMIT_MEMORY = r'''
import resource
def _vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
_limit = _vm_bytes() + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
'''


def read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def answer_hello(conn: socket.socket) -> int:
    """Plays rank 0's side of the hello (handshake.cpp) with no secret: reads the caller's hello
    (and its proof, if flagged) and welcomes it. Returns the channel (1 store, 2 monitor, 3 ring)."""
    hello = read_exactly(conn, HELLO_BYTES)
    assert hello[:8] == b"CYXWIZRV", hello
    channel, flags = struct.unpack_from("<HH", hello, 12)
    if flags & HAS_PROOF:
        read_exactly(conn, PROOF_BYTES)
    conn.sendall(struct.pack("<II", 0, 0))  # status 0 = welcome, no reason
    return channel


def hello_channel(first_bytes: bytes) -> int:
    """The channel a connection opens, from the first bytes of its hello (handshake.cpp)."""
    return struct.unpack_from("<H", first_bytes, 12)[0]


class Server:
    """A listening socket on 127.0.0.1 that runs `handle(conn)` for each connection on a thread."""

    def __init__(self, handle):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        self.conns: list[socket.socket] = []
        self.errors: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        try:
            self.handle(conn)
        except OSError:
            pass  # the rank went away
        except Exception as e:  # noqa: BLE001  (reported by the test)
            self.errors.append(repr(e))

    def close(self):
        for s in [self.sock, *self.conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


# ------------------------------------------------------------------ the store's reply length

STORE_CODE = r'''
import json, os, sys, time
import pycyxwiz as cx
D = cx.distributed
''' + LIMIT_MEMORY + r'''
t0 = time.monotonic()
try:
    D.init()
    print("JOINED", flush=True)
except BaseException as e:
    print("ERROR " + json.dumps({"cls": type(e).__name__, "msg": str(e), "elapsed": time.monotonic() - t0,
                                 "store": isinstance(e, D.DistStoreError)}), flush=True)
    sys.exit(3)
'''


@pytest.mark.parametrize("length", [8 << 30, (1 << 64) - 1], ids=["8GiB", "2^64-1"])
def test_store_reply_with_a_huge_length_is_refused(ranks, length):
    def fake_master(conn):
        if answer_hello(conn) != 1:
            time.sleep(30)  # the monitor: stays quiet
            return
        head = read_exactly(conn, FRAME.size)  # the rank's first request: publishing its ring address
        _, _, key_len, value_len = FRAME.unpack(head)
        read_exactly(conn, key_len + value_len)
        conn.sendall(FRAME.pack(0, 0, 0, length) + bytes(1 << 20))  # "here come 8 GiB"
        time.sleep(30)

    server = Server(fake_master)
    try:
        (proc,) = ranks.start(STORE_CODE, 2, ranks=[1], env={"MASTER_PORT": server.port,
                                                              "DISTRIBUTED_TIMEOUT_MS": "10000"})
        (res,) = ranks.wait([proc], timeout=30)
    finally:
        server.close()
    report = ranks.report([res]) + "\nserver errors: " + repr(server.errors)
    assert not server.errors, report
    assert res.rc == 3, report
    (line,) = [l for l in res.out.splitlines() if l.startswith("ERROR ")]
    e = json.loads(line[len("ERROR "):])
    assert e["cls"] == "DistStoreError" and e["store"], report
    assert e["msg"].startswith("[rank 1/2] "), report
    assert f"127.0.0.1:{server.port}" in e["msg"], report        # names the peer
    assert str(length) in e["msg"], report                       # and what it claimed
    assert "not a pycyxwiz master of this job" in e["msg"], report
    assert e["elapsed"] < 5.0, report                            # at once, not at the timeout


# --------------------------------------------------------------------- the monitor's notices

# Run after test_failures.PRELUDE (which joins the job): the lie comes after init.
MONITOR_CODE = LIMIT_MEMORY + r'''
emit("READY")
t0 = time.monotonic()
try:
    if RANK == 0:
        time.sleep(4.0)               # rank 1 waits in its all_reduce meanwhile
    a = np.full(1000, RANK + 1.0, np.float32)
    D.all_reduce(a)
    emit("RESULT", first=float(a[0]))
except BaseException as e:
    error(e, t0)
    sys.exit(3)
'''


class LyingProxy:
    """Stands between rank 1 and rank 0's real rendezvous, passing bytes both ways untouched; on
    `lie()` it writes a notice header claiming `length` bytes (then zeros) into rank 1's monitor
    connection, as if rank 0 had sent it."""

    def __init__(self, master_port: int, length: int):
        self.master_port, self.length = master_port, length
        self.monitors: list[socket.socket] = []
        self.server = Server(self._bridge)

    def _bridge(self, client):
        upstream = socket.create_connection(("127.0.0.1", self.master_port), timeout=30)
        self.server.conns.append(upstream)
        first = read_exactly(client, HELLO_BYTES)
        upstream.sendall(first)
        if hello_channel(first) == 2:
            self.monitors.append(client)

        def pump(src, dst):
            try:
                while data := src.recv(1 << 16):
                    dst.sendall(data)
            except OSError:
                pass
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    def lie(self):
        (monitor,) = self.monitors
        try:
            monitor.sendall(FRAME.pack(1, 1, 0, self.length))  # Notice::Abort, ErrorKind::Network
            for _ in range(64):
                monitor.sendall(bytes(1 << 20))
        except OSError:
            pass  # the rank hung up on the lie: what it should do

    def close(self):
        self.server.close()


@pytest.mark.parametrize("length", [8 << 30, (1 << 64) - 8], ids=["8GiB", "wraps_2^64"])
def test_monitor_notice_with_a_huge_length_is_refused(watch, ranks, length):
    proxy = LyingProxy(ranks.port, length)
    try:
        procs = watch.start(MONITOR_CODE, 2, rank_env={1: {"MASTER_PORT": proxy.server.port}},
                            env={"DISTRIBUTED_TIMEOUT_MS": "20000"})
        watch.wait_line(procs, "READY", timeout=60)
        time.sleep(0.5)  # rank 1 is in its all_reduce, watching the monitor
        lied_at = time.monotonic()
        threading.Thread(target=proxy.lie, daemon=True).start()
        watch.finish([procs[1]], timeout=20)
    finally:
        proxy.close()
    report = watch.report(procs) + "\nproxy errors: " + repr(proxy.server.errors)
    r1 = procs[1]
    assert not r1.has("RESULT"), report
    assert r1.popen.returncode == 3, report
    arrived, e = r1.record("ERROR")
    assert e["cls"] == "DistNetworkError" and e["network"], report
    assert e["msg"].startswith("[rank 1/2] all_reduce #"), report
    assert f"rank 0 (127.0.0.1:{proxy.server.port})" in e["msg"], report   # the peer it talks to
    assert str(length) in e["msg"], report
    assert "not a pycyxwiz master of this job" in e["msg"], report
    assert arrived - lied_at < 3.0, report                                  # at once, not at rank 0's call
