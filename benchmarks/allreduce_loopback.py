"""TCP loopback limit for benchmarks/allreduce.py: what one TCP stream, and two processes sending to
each other at once, can move over 127.0.0.1 on this machine.

    python benchmarks/allreduce_loopback.py            # prints the measurements as JSON

Measurements (each skipped with a reason when it cannot run):
  iperf3 one stream      iperf3 -c 127.0.0.1 -t T against an `iperf3 -s` that this module starts and kills
  iperf3 --bidir         the same, one stream each way (one iperf3 process at each end)
  python one stream      one process pushes TOTAL bytes in 4 MiB sendall() calls to another, which
                         recv_into()s them and acknowledges; rate = TOTAL / (first send .. ack)
  python both ways       two processes, each sending TOTAL bytes to the other while it receives TOTAL
                         (a sender thread and a receiving loop each; sendall/recv_into release the GIL):
                         what a 2-rank ring's two links ask of the machine. Rate per direction and in total.
1 GB = 1e9 bytes.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

CHUNK = 4 << 20


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _recv_exact(sock, total, buf):
    view = memoryview(buf)
    got = 0
    while got < total:
        n = sock.recv_into(view[: min(len(buf), total - got)])
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {total} bytes")
        got += n


def _send_total(sock, total, buf):
    view = memoryview(buf)
    left = total
    while left > 0:
        n = min(len(buf), left)
        sock.sendall(view[:n])
        left -= n


# ---- the processes that the measurements start (python allreduce_loopback.py --role ...) ----

def _accept_one(port):
    """Listen on 127.0.0.1:port, say so on stdout (the driver waits for it), accept one connection."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    print("LISTENING", flush=True)
    conn, _ = srv.accept()
    return conn


def _role_sink(port, total):
    """Accept one connection, receive `total` bytes, send one byte back."""
    conn = _accept_one(port)
    buf = bytearray(CHUNK)
    _recv_exact(conn, total, buf)
    conn.sendall(b"k")
    conn.close()


def _role_peer(port, total, listen):
    """Both ways: connect (or accept), then send `total` bytes while receiving `total`; print our rates."""
    if listen:
        conn = _accept_one(port)
    else:
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Start together: exchange one byte.
    conn.sendall(b"s")
    _recv_exact(conn, 1, bytearray(1))
    sbuf, rbuf = bytearray(CHUNK), bytearray(CHUNK)
    t0 = time.perf_counter()
    done = {}

    def sender():
        _send_total(conn, total, sbuf)
        done["send"] = time.perf_counter() - t0

    th = threading.Thread(target=sender)
    th.start()
    _recv_exact(conn, total, rbuf)
    recv_s = time.perf_counter() - t0
    th.join()
    print(json.dumps({"recv_s": recv_s, "send_s": done.get("send"), "bytes": total}), flush=True)
    conn.close()


# ---- measurements, run from the driver ----

def _wait_line(proc, want, timeout):
    """Read proc's stdout until a line equal to `want` (stdout must be a pipe)."""
    deadline = time.monotonic() + timeout
    box = {}

    def reader():
        box["line"] = proc.stdout.readline()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    th.join(max(0.0, deadline - time.monotonic()))
    line = box.get("line")
    if line is None or line.strip() != want:
        raise RuntimeError(f"helper process did not start (got {line!r})")


def python_one_stream(total, timeout=60):
    port = _free_port()
    proc = None
    try:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "sink", "--port", str(port),
                                 "--bytes", str(total)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        _wait_line(proc, "LISTENING", 30)
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            buf = bytearray(CHUNK)
            t0 = time.perf_counter()
            _send_total(s, total, buf)
            _recv_exact(s, 1, bytearray(1))
            dt = time.perf_counter() - t0
        proc.wait(timeout=timeout)
        return {"GBps": total / dt / 1e9, "bytes": total, "seconds": dt, "chunk": CHUNK}
    finally:
        _kill(proc)


def python_both_ways(total, timeout=120):
    port = _free_port()
    procs = []
    try:
        base = [sys.executable, os.path.abspath(__file__), "--role", "peer", "--port", str(port), "--bytes", str(total)]
        a = subprocess.Popen(base + ["--listen"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        procs.append(a)
        _wait_line(a, "LISTENING", 30)
        b = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(b)
        outs = []
        for p in (a, b):
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"peer failed (rc {p.returncode}): {err.strip()[-300:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        # Each process's receive rate is one direction; both directions ran at the same time.
        dirs = [total / o["recv_s"] / 1e9 for o in outs]
        wall = max(max(o["recv_s"], o["send_s"] or 0) for o in outs)
        return {"per_direction_GBps": dirs, "total_GBps": 2 * total / wall / 1e9, "bytes_each_way": total,
                "seconds": wall, "chunk": CHUNK}
    finally:
        for p in procs:
            _kill(p)


def iperf3(seconds, bidir=False, timeout=None):
    exe = shutil.which("iperf3")
    if exe is None:
        return {"skipped": "iperf3 is not installed (apt-get install iperf3)"}
    timeout = timeout or seconds + 30
    port = _free_port()
    srv = None
    try:
        srv = subprocess.Popen([exe, "-s", "-B", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        cmd = [exe, "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"] + (["--bidir"] if bidir else [])
        last = ""
        for _ in range(25):  # the server needs a moment to listen
            time.sleep(0.2)
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return {"error": f"iperf3 client ran past {timeout} s"}
            try:
                j = json.loads(r.stdout)
            except ValueError:
                j = {"error": (r.stdout + r.stderr).strip()[-300:]}
            if "error" not in j and r.returncode == 0:
                break
            last = j.get("error", "")
            if bidir and "bidir" in last.lower():
                return {"skipped": f"this iperf3 has no --bidir: {last}"}
            if "connect" not in last.lower():
                return {"error": last}
        else:
            return {"error": f"iperf3 client could not run: {last}"}
        end = j["end"]
        out = {"GBps": end["sum_received"]["bits_per_second"] / 8e9, "seconds": seconds,
               "cpu_percent": end.get("cpu_utilization_percent", {})}
        if bidir:
            rev = end["sum_received_bidir_reverse"]["bits_per_second"] / 8e9
            out = {"per_direction_GBps": [out["GBps"], rev], "total_GBps": out["GBps"] + rev, "seconds": seconds}
        return out
    finally:
        _kill(srv)


def iperf3_version():
    exe = shutil.which("iperf3")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
        return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def measure_all(quick=False, log=None):
    """Every loopback measurement; each entry holds a result, {'skipped': why} or {'error': what}."""
    secs = 1 if quick else 2
    total = (256 << 20) if quick else (1 << 30)
    res = {"iperf3_version": iperf3_version()}
    steps = [("iperf3_one_stream", lambda: iperf3(secs)),
             ("iperf3_bidir", lambda: iperf3(secs, bidir=True)),
             ("python_one_stream", lambda: python_one_stream(total)),
             ("python_both_ways", lambda: python_both_ways(total))]
    for name, fn in steps:
        if log:
            log(f"loopback: {name} ...")
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - a failed measurement is reported, not fatal
            res[name] = {"error": f"{type(e).__name__}: {e}"}
    one = res.get("iperf3_one_stream", {})
    if "GBps" in one:
        res["one_stream_GBps"], res["one_stream_source"] = one["GBps"], "iperf3"
    elif "GBps" in res.get("python_one_stream", {}):
        res["one_stream_GBps"], res["one_stream_source"] = res["python_one_stream"]["GBps"], "python sockets"
    both = res.get("python_both_ways", {})
    if "per_direction_GBps" in both:
        res["both_ways_per_direction_GBps"] = min(both["per_direction_GBps"])
        res["both_ways_total_GBps"] = both["total_GBps"]
    return res


def main():
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["sink", "peer"])
    p.add_argument("--port", type=int)
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--listen", action="store_true")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.role == "sink":
        _role_sink(a.port, a.bytes)
    elif a.role == "peer":
        _role_peer(a.port, a.bytes, a.listen)
    else:
        print(json.dumps(measure_all(a.quick, log=lambda m: print(m, file=sys.stderr)), indent=1))


if __name__ == "__main__":
    main()
