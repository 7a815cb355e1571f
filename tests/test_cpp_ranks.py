"""A C++ program built against the installed package (tests/cpp/rank_checks.cpp) runs as the 3 ranks
of a job on 127.0.0.1, one process each, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its
environment: the engine as a C++ user meets it, with no Python in the ranks.

Each mode of rank_checks checks itself and prints "[rank r/N] PASS ..." / "FAIL ..." lines and a last
"DONE <mode>: <p> passed, <f> failed" line; this driver starts the ranks (a free port per test, a hard
timeout, every process killed when the test ends, passed or failed: tests/harness.py), reads those
lines and checks what the ranks cannot see themselves: exit statuses, the messages of the ranks that
fail (the substrings tests/distributed asserts for the same cases), the logs, files left behind.

The program and how to start it are parameters (`RankChecks`): by default the session builds the
package (tests/cpp_build.py, shared with test_cpp_package.py) and rank_checks against it, and runs it
directly. CYXWIZ_RANK_CHECKS=<executable> runs a program built elsewhere instead, and
CYXWIZ_RANK_CHECKS_PREFIX a command in front of it (shell words), so that a Windows build runs here
as `CYXWIZ_RANK_CHECKS_PREFIX=wine CYXWIZ_RANK_CHECKS=rank_checks.exe pytest tests/test_cpp_ranks.py`.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cpp_build import ROOT, build_program, install_package, prepared_build
from harness import Ranks, Result

WORLD = 3
ADDR = r"\d{1,3}(?:\.\d{1,3}){3}:\d{1,5}"  # an "ip:port"
# The build takes a minute or two on 2 cores; the first test pays for it. Every job has a hard
# timeout of its own (JOB_TIMEOUT) well inside this.
pytestmark = pytest.mark.timeout(900)
JOB_TIMEOUT = 90.0


@dataclass(frozen=True)
class RankChecks:
    """How to start rank_checks: a command prefix (e.g. ("wine",)) and the executable."""

    exe: Path
    prefix: tuple[str, ...] = ()

    def command(self, *args: str) -> list[str]:
        return [*self.prefix, str(self.exe), *args]


@pytest.fixture(scope="session")
def rank_checks(tmp_path_factory) -> RankChecks:
    given = os.environ.get("CYXWIZ_RANK_CHECKS")
    prefix = tuple(shlex.split(os.environ.get("CYXWIZ_RANK_CHECKS_PREFIX", "")))
    if given:
        exe = Path(given).resolve()
        assert exe.is_file(), f"CYXWIZ_RANK_CHECKS={given}: no such file"
        return RankChecks(exe, prefix)
    package = install_package(tmp_path_factory)
    # CI's ahead-of-time build (tests/cpp_build.py) left it built there; otherwise a fresh folder.
    build = prepared_build("rank_checks") or tmp_path_factory.mktemp("rank_checks") / "build"
    return RankChecks(build_program(ROOT / "tests" / "cpp", build, package, "rank_checks"), prefix)


@dataclass
class RankRun:
    """One rank's outcome: exit status (None: killed at the hard timeout), output, and its lines."""

    rank: int
    rc: int | None
    out: str
    err: str

    def lines(self, kind: str) -> list[str]:
        """The text after "[rank r/N] <kind> " of each such line of stdout."""
        head = f"[rank {self.rank}/{WORLD}] {kind} "
        return [line[len(head):] for line in self.out.splitlines() if line.startswith(head)]

    def done(self) -> tuple[int, int] | None:
        """(passed, failed) from the DONE line."""
        for line in self.lines("DONE"):
            m = re.search(r": (\d+) passed, (\d+) failed$", line)
            if m:
                return int(m[1]), int(m[2])
        return None


def report(runs: list[RankRun]) -> str:
    return "\n".join(f"--- rank {r.rank} rc={r.rc}\n{r.out}\n{r.err}" for r in runs)[-12000:]


def start_job(ranks: Ranks, program: RankChecks, args, env: dict | None = None, rank_env: dict | None = None,
              which=range(WORLD)) -> list:
    """Starts ranks `which` of a WORLD-rank job on 127.0.0.1:ranks.port. args: the command line after the
    executable, or a function of the rank giving it."""
    procs = []
    for r in which:
        argv = args(r) if callable(args) else args
        e = ranks.env(r, WORLD, {**(env or {}), **(rank_env or {}).get(r, {})})
        procs.append(ranks.popen(program.command(*argv), e, rank=r))
    return procs


def finish_job(ranks: Ranks, procs: list, timeout: float = JOB_TIMEOUT) -> list[RankRun]:
    """Waits for every rank (one deadline; the ones still running then are killed), in rank order."""
    results: list[Result] = ranks.wait(procs, timeout)
    runs = sorted((RankRun(r.rank, r.rc, r.out, r.err) for r in results), key=lambda r: r.rank)
    hung = [r.rank for r in runs if r.rc is None]
    assert not hung, f"ranks {hung} still ran after {timeout} s and were killed\n{report(runs)}"
    return runs


def run_job(ranks: Ranks, program: RankChecks, args, **kw) -> list[RankRun]:
    return finish_job(ranks, start_job(ranks, program, args, **kw))


def assert_all_passed(runs: list[RankRun], mode: str, at_least: int = 1) -> None:
    """Every given rank exited 0 after a DONE line with no failure and at least `at_least` checks."""
    for r in runs:
        fails = r.lines("FAIL")
        assert not fails and r.rc == 0, f"rank {r.rank}: rc={r.rc}, {len(fails)} failed\n{report(runs)}"
        done = r.done()
        assert done is not None and done[1] == 0 and done[0] >= at_least, \
            f"rank {r.rank}: DONE {mode} line {done}, expected >= {at_least} passed\n{report(runs)}"


# ----------------------------------------------------------------------------------- collectives

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8", "int16", "bool"]
COLLECTIVES = ["all_reduce", "reduce_scatter", "reduce_scatter (in place)", "all_gather (in place)", "broadcast",
               "all_gather", "gather", "scatter", "all_to_all", "send/recv", "all_reduce on a shared buffer"]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_every_collective_op_and_dtype(ranks, rank_checks, transport):
    env = {"CYXWIZ_TRANSPORT": transport}
    if transport == "tcp":
        env["CYXWIZ_RING_SLICE_BYTES"] = 16384  # the 100003-element calls take several ring slices
    runs = run_job(ranks, rank_checks, ["collectives"], env=env)
    assert_all_passed(runs, "collectives")
    for r in runs:
        passed = r.lines("PASS")
        assert f"the job runs over {transport}" in passed, report(runs)
        for c in COLLECTIVES:
            for d in DTYPES:
                assert any(p.startswith(f"{c} {d} (") for p in passed), f"rank {r.rank}: no PASS line for {c} {d}"
        for c in ["all_reduce", "reduce_scatter", "reduce_scatter (in place)"]:
            assert f"{c} AVG of bool is refused" in passed, report(runs)
        assert "barrier" in passed


# ---------------------------------------------------------------------------------- a rank dies

@pytest.mark.parametrize("victim,transport", [(1, "shm"), (2, "tcp"), (0, "shm"), (0, "tcp")])
def test_a_rank_that_exits_mid_job_is_named_by_every_survivor(ranks, rank_checks, victim, transport):
    # The error must come from the closed connections within `within_s`, well before the timeout. The
    # timeout also bounds the rendezvous, where a rank started under Wine on a busy 2-core host once took
    # more than 5 s to join: it is long, the bound on the error is not.
    timeout_ms, within_s = 20000, 5.0
    runs = run_job(ranks, rank_checks, ["killed", str(victim)],
                   env={"DISTRIBUTED_TIMEOUT_MS": timeout_ms, "CYXWIZ_TRANSPORT": transport})
    dead = runs[victim]
    assert dead.rc == 41 and dead.lines("EXITING"), f"rank {victim} did not leave through std::_Exit\n{report(runs)}"
    survivors = [r for r in runs if r.rank != victim]
    assert_all_passed(survivors, "killed", at_least=6)
    for r in survivors:
        [error] = r.lines("ERROR")
        m = re.fullmatch(r"(\w+) after ([\d.]+) s: (.*)", error)
        assert m, error
        cls, elapsed, msg = m[1], float(m[2]), m[3]
        assert cls == "NetworkError", report(runs)
        assert re.match(rf"\[rank {r.rank}/{WORLD}\] all_reduce #\d+ \(", msg), f"does not start with the call: {msg}"
        if victim == 0:
            # Rank 0 serves the rendezvous and the monitor: the others lost their line to it.
            assert "lost the connection to rank 0" in msg and f"rank 0 (127.0.0.1:{ranks.port})" in msg, msg
        else:
            assert re.search(rf"rank {victim} \({ADDR}\) died", msg), msg
        assert elapsed < within_s, f"rank {r.rank} took {elapsed} s\n{report(runs)}"


# --------------------------------------------------------------------- a stranger on the master port

GARBAGE = [b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"\x00\xff" + bytes(range(62)),
           b"CYXWIZRV" + b"\x02\x00" + b"\xee" * 30, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x42" * 40]


class Stranger:
    """Connects to 127.0.0.1:port again and again and sends garbage (one kept-open connection says
    nothing at all) until stopped."""

    def __init__(self, port: int):
        self.port = port
        self.stop = threading.Event()
        self.sent = 0
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                time.sleep(0.02)  # rank 0 is not listening yet
                continue
            self.sockets.append(s)
            if i > 0:  # the first connection stays open and silent
                try:
                    s.sendall(GARBAGE[i % len(GARBAGE)])
                    self.sent += 1
                except OSError:
                    pass
            i += 1
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        for s in self.sockets:
            s.close()


def test_garbage_on_the_master_port_does_not_stop_the_job(ranks, rank_checks):
    procs = start_job(ranks, rank_checks, ["stranger"], which=[0])
    stranger = Stranger(ranks.port)
    try:
        deadline = time.monotonic() + 30
        while stranger.sent < 3:  # rank 0 is up and has been sent garbage before the others start
            assert time.monotonic() < deadline and procs[0].poll() is None, "rank 0 never took the stranger's connections"
            time.sleep(0.02)
        procs += start_job(ranks, rank_checks, ["stranger"], which=[1, 2])
        runs = finish_job(ranks, procs)
    finally:
        stranger.close()
    assert_all_passed(runs, "stranger", at_least=4)
    refused = [line for line in runs[0].err.splitlines() if "rendezvous: refused a connection from 127.0.0.1" in line]
    assert refused, f"rank 0 did not log the stranger\n{report(runs)}"


# ------------------------------------------------------------------------------- the shared secret

def test_a_rank_with_another_secret_is_refused_and_told_why(ranks, rank_checks):
    secret, other = "s3cret-9f2c", "0ther-71ab"
    runs = run_job(ranks, rank_checks, lambda r: ["secret", "refused" if r == 1 else "member"],
                   env={"CYXWIZ_SECRET": secret, "DISTRIBUTED_TIMEOUT_MS": 3000}, rank_env={1: {"CYXWIZ_SECRET": other}})
    assert_all_passed(runs, "secret", at_least=2)
    [error] = runs[1].lines("ERROR")
    assert error.startswith("StoreError") and "CYXWIZ_SECRET" in error and "refused this rank" in error, error
    assert f"127.0.0.1:{ranks.port}" in error, error
    # Rank 0 logs the refusal, and nobody ever prints a secret.
    assert "refused a connection" in runs[0].err and "CYXWIZ_SECRET" in runs[0].err, report(runs)
    for r in runs:
        assert secret not in r.out + r.err and other not in r.out + r.err, report(runs)


# ---------------------------------------------------------------------------------------------- DDP

def test_ddp_on_3_ranks_ends_where_one_process_ends(ranks, rank_checks):
    runs = run_job(ranks, rank_checks, ["ddp"])
    assert_all_passed(runs, "ddp", at_least=12)
    for r in runs:
        for case in ["default buckets", "tiny buckets", "sharded optimizer step"]:
            assert any(p.startswith(f"DDP, {case}: 3 ranks x 16 rows vs 1 process x 48 rows") for p in r.lines("PASS"))
            assert f"DDP, {case}: the parameters are bit-identical on every rank" in r.lines("PASS")


# ----------------------------------------------------------------------------------------- files

def test_checkpoint_and_model_files_written_replaced_and_read_back(ranks, rank_checks):
    runs = run_job(ranks, rank_checks, ["checkpoint", "."])  # "." is the test's folder: the ranks' cwd
    assert_all_passed(runs, "checkpoint", at_least=10)
    folder = ranks.tmp_path / "checkpoints"
    want = {f"checkpoint_epoch_0001.rank{r}.ckpt" for r in range(WORLD)} | {f"model.rank{r}.cyxmodel" for r in range(WORLD)}
    assert {p.name for p in folder.iterdir()} == want, "the folder holds other files than the ranks' (temporary files?)"
