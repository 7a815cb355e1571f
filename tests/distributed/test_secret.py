"""The shared secret (CYXWIZ_SECRET): ranks and rank 0 prove to each other that they hold it, over
fresh nonces (a recorded exchange cannot be replayed); the secret never travels. The launcher and
spawn make a random one per job; an open job on a network address is warned about."""

import hashlib
import hmac
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from harness import clean_env

import pycyxwiz as cx
from test_rendezvous import FAILING_INIT, JOB, check_job, connect, last_json

ALL_REDUCE = """
import json, numpy as np, pycyxwiz as cx
try:
    cx.distributed.init()
    a = np.full(4, cx.distributed.get_rank() + 1.0, np.float32)
    cx.distributed.all_reduce(a)
    print(json.dumps({"sum": a.tolist()}))
    cx.distributed.finalize()
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


@pytest.mark.parametrize("key,message", [(b"", b""), (b"key", b"The quick brown fox jumps over the lazy dog"),
                                         (b"k" * 64, b"x" * 55), (b"k" * 65, b"x" * 56), (b"s" * 200, bytes(range(256)) * 9)])
def test_hmac_matches_python(key, message):
    ours = cx._core.distributed._hmac_sha256(key.decode(), message)
    assert ours == hmac.new(key, message, hashlib.sha256).digest()


def test_the_same_secret_on_every_rank_forms_the_job(ranks):
    res = ranks.run(ALL_REDUCE, 3, env={"CYXWIZ_SECRET": "s3cret"})
    outs = [json.loads(r.out.strip().splitlines()[-1]) for r in res]
    assert outs == [{"sum": [6.0] * 4}] * 3, ranks.report(res)


@pytest.mark.parametrize("secret1", ["other", "<unset>"], ids=["wrong-secret", "no-secret"])
def test_a_process_without_the_secret_is_refused_and_told_why(ranks, secret1):
    res = ranks.run(ALL_REDUCE, 2, env={"CYXWIZ_SECRET": "s3cret", "DISTRIBUTED_TIMEOUT_MS": "3000"},
                    rank_env={1: {"CYXWIZ_SECRET": secret1}})
    intruder = json.loads(res[1].out.strip().splitlines()[-1])
    assert intruder["error"] == "DistStoreError", ranks.report(res)
    assert "CYXWIZ_SECRET" in intruder["message"] and "refused this rank" in intruder["message"]
    # Rank 0 logs the refusal, and never prints the secret itself.
    assert "refused a connection" in res[0].err and "CYXWIZ_SECRET" in res[0].err
    assert all("s3cret" not in r.out + r.err for r in res)


def test_a_secret_only_on_the_caller_is_refused(ranks):
    res = ranks.run(ALL_REDUCE, 2, env={"DISTRIBUTED_TIMEOUT_MS": "3000"}, rank_env={1: {"CYXWIZ_SECRET": "mine"}})
    intruder = json.loads(res[1].out.strip().splitlines()[-1])
    assert intruder["error"] == "DistStoreError" and "this rank has none" in intruder["message"], ranks.report(res)


def test_repr_never_shows_the_secret(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CYXWIZ_SECRET", "hunter2")
    config = cx.distributed.DistributedConfig.from_environment()
    assert config.secret == "hunter2"
    assert "hunter2" not in repr(config) and "shared secret" in repr(config)
    assert os.environ["CYXWIZ_SECRET"] == "hunter2"


# ------------------------------------------------------------------------ the handshake is mutual



class RecordingProxy:
    """Listens on a port of its own and forwards every connection to 127.0.0.1:target, recording
    what each side sent, in order: [(from_client, bytes), ...] per connection."""

    def __init__(self, target: int):
        self.target = target
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.records: list[list[tuple[bool, bytes]]] = []
        self.sockets: list[socket.socket] = []
        self.stop = False
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self):
        while not self.stop:
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            upstream = None
            deadline = time.monotonic() + 20
            while upstream is None and time.monotonic() < deadline and not self.stop:
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                except OSError:
                    time.sleep(0.05)  # rank 0 is not listening yet
            if upstream is None:
                client.close()
                continue
            self.sockets += [client, upstream]
            record: list[tuple[bool, bytes]] = []
            self.records.append(record)
            for src, dst, from_client in ((client, upstream, True), (upstream, client, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, from_client, record), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src, dst, from_client, record):
        src.settimeout(60)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record and record[-1][0] == from_client:
                    record[-1] = (from_client, record[-1][1] + data)
                else:
                    record.append((from_client, data))
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.stop = True
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(timeout=5)
        for s in self.sockets:
            s.close()
        self.server.close()


def test_a_recorded_handshake_cannot_be_replayed(ranks):
    """A job with a secret, its rank 1 reaching rank 0 through a recording proxy (a sniffer). Replaying
    rank 1's half of its store connection to the next job with the same secret does not take rank 1's
    seat there: rank 0 closes the replay, and the real rank 1 joins."""
    env = {"CYXWIZ_SECRET": "a-secret-used-twice", "CYXWIZ_JOB_ID": "nightly", "DISTRIBUTED_TIMEOUT_MS": "15000"}
    proxy = RecordingProxy(ranks.port)
    try:
        procs = ranks.start(JOB, 2, ranks=[0], env=env)
        procs += ranks.start(JOB, 2, ranks=[1], env={**env, "MASTER_PORT": proxy.port})
        check_job(ranks, ranks.wait(procs, timeout=60), 2)
    finally:
        proxy.close()
    store = [r for r in proxy.records if r and r[0][0] and struct.unpack_from("<H", r[0][1], 12)[0] == 1]
    assert len(store) == 1, proxy.records
    sent = [data for from_client, data in store[0] if from_client][:2]  # the handshake, and what followed it

    for name in ("formed0", "formed1"):
        (ranks.tmp_path / name).unlink()
    procs = ranks.start(JOB, 2, ranks=[0], env=env, name="second_job.py")
    with connect(ranks.port) as replay:
        replay.settimeout(3)
        answers = b""
        try:
            for data in sent:
                replay.sendall(data)
                time.sleep(0.3)
                answers += replay.recv(65536)
            while replay.recv(65536):
                pass
            closed = True
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        except socket.timeout:
            closed = False  # rank 0 keeps talking to the replay: it took a seat
        assert closed, f"rank 0 accepted the replayed handshake (it answered {answers[:64]!r})"
    procs += ranks.start(JOB, 2, ranks=[1], env=env, name="second_job.py")
    results = ranks.wait(procs, timeout=60)
    check_job(ranks, results, 2)
    err0 = next(r.err for r in results if r.rank == 0)
    assert "refused a connection from 127.0.0.1" in err0 and "CYXWIZ_SECRET" in err0, err0


def test_a_fake_rank_0_that_welcomes_without_proof_is_refused(ranks):
    """Something on MASTER_PORT that answers every hello with a welcome but cannot prove the secret:
    a rank with a secret gives up at once with DistStoreError, and tells it nothing more."""
    received = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", ranks.port))
        server.listen(8)
        server.settimeout(0.2)
        [proc] = ranks.start(FAILING_INIT, 2, ranks=[1], env={"CYXWIZ_SECRET": "s3cret", "DISTRIBUTED_TIMEOUT_MS": "8000"})
        conns = []
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
                conn.settimeout(2)
                conns.append(conn)
                data = conn.recv(4096)
                conn.sendall(bytes(8))  # "welcome"
                time.sleep(0.2)
                conn.setblocking(False)
                try:
                    data += conn.recv(65536)
                except BlockingIOError:
                    pass
                received.append(data)
            except OSError:
                continue
        [result] = ranks.wait([proc], timeout=30)
        for conn in conns:
            conn.close()
    out = last_json(result)
    assert out["type"] == "DistStoreError", out
    assert "CYXWIZ_SECRET" in out["message"] and f"127.0.0.1:{ranks.port}" in out["message"], out
    assert out["elapsed"] < 4, out
    # The rank sent its hello and nonce, and nothing after the fake welcome (no proof, no request).
    assert len(received) == 1 and len(received[0]) == 72, received


# ------------------------------------------------------------------- launcher and spawn make one

SECRET_DUMP = """
import json, os, sys
import numpy as np
import pycyxwiz as cx
cx.distributed.init()
a = np.ones(3, np.float32)
cx.distributed.all_reduce(a)
out = {"rank": cx.distributed.get_rank(), "secret": os.environ.get("CYXWIZ_SECRET"), "sum": a.tolist()}
cx.distributed.finalize()
open(os.path.join(sys.argv[1], f"{out['rank']}.json"), "w").write(json.dumps(out))
"""


def launch(ranks, args, env_extra=None) -> subprocess.CompletedProcess:
    p = ranks.popen([sys.executable, "-m", "pycyxwiz.launch", *args], clean_env(**(env_extra or {})))
    r = ranks.finish(p, 90)
    return subprocess.CompletedProcess(p.args, r.rc, r.out, r.err)


def read_outs(directory):
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json")}


def test_the_launcher_gives_every_job_a_fresh_random_secret(ranks, tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(SECRET_DUMP)
    secrets_seen = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        result = launch(ranks, ["--nproc-per-node", "2", str(script), str(tmp_path / run)])
        assert result.returncode == 0, result.stderr
        outs = read_outs(tmp_path / run)
        assert [outs[r]["sum"] for r in (0, 1)] == [[2.0] * 3] * 2
        secret = outs[0]["secret"]
        assert outs[1]["secret"] == secret and re.fullmatch(r"[0-9a-f]{64}", secret or ""), outs
        assert secret not in result.stdout + result.stderr  # one node: nobody needs to see it
        secrets_seen.append(secret)
    assert secrets_seen[0] != secrets_seen[1]
    (tmp_path / "c").mkdir()
    result = launch(ranks, ["--nproc-per-node", "2", str(script), str(tmp_path / "c")], {"CYXWIZ_SECRET": "mine"})
    assert result.returncode == 0, result.stderr
    assert {o["secret"] for o in read_outs(tmp_path / "c").values()} == {"mine"}  # the user's own wins


def _spawned_secret(local_rank):
    import numpy as np
    cx.distributed.init()
    a = np.ones(2, np.float32)
    cx.distributed.all_reduce(a)
    cx.distributed.finalize()
    return os.environ.get("CYXWIZ_SECRET"), a.tolist()


def test_spawn_gives_every_job_a_fresh_random_secret(monkeypatch):
    monkeypatch.delenv("CYXWIZ_SECRET", raising=False)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    first = cx.distributed.spawn(_spawned_secret, nprocs=2, timeout=60)
    second = cx.distributed.spawn(_spawned_secret, nprocs=2, timeout=60)
    for results in (first, second):
        assert [r[1] for r in results] == [[2.0, 2.0]] * 2
        assert results[0][0] == results[1][0] and re.fullmatch(r"[0-9a-f]{64}", results[0][0] or ""), results
    assert first[0][0] != second[0][0]
    assert "CYXWIZ_SECRET" not in os.environ


# --------------------------------------------------- a warning for an open job on a real network


def non_loopback_ip():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


NO_SECRET_WARNING = "has no shared secret"


@pytest.mark.parametrize("case", ["network-no-secret", "network-secret", "loopback-no-secret"])
def test_an_open_job_on_a_network_address_is_warned_about_once(ranks, case):
    ip = non_loopback_ip()
    if ip is None and case.startswith("network"):
        pytest.skip("this machine has no non-loopback address")
    env = {"MASTER_ADDR": ip if case.startswith("network") else "127.0.0.1"}
    if case == "network-secret":
        env["CYXWIZ_SECRET"] = "s3cret"
    res = ranks.run(ALL_REDUCE + "\ncx.distributed.init()\ncx.distributed.finalize()\n", 2, env=env)
    outs = [json.loads(r.out.strip().splitlines()[-1]) for r in res]
    assert outs == [{"sum": [3.0] * 4}] * 2, ranks.report(res)
    warned = [r.err.count(NO_SECRET_WARNING) for r in res]
    assert warned == ([1, 0] if case == "network-no-secret" else [0, 0]), ranks.report(res)
    if case == "network-no-secret":
        assert "CYXWIZ_SECRET" in res[0].err and f"{ip}:{ranks.port}" in res[0].err, res[0].err
