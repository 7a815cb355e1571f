"""What every multi-process test shares: a free port, a clean environment, and `Ranks`, which starts
processes and guarantees they are gone when the test ends. The rules, for every test in tests/:

  * 127.0.0.1 only, and a free port per test (`free_port()`; `Ranks` takes one when created).
  * A hard timeout on every wait: a process still running at its deadline is killed.
  * Every process runs in a session of its own and is killed with its process group and whatever
    else is in its session (SIGCONT, then SIGKILL) when the test ends, passed or failed (the `ranks`
    fixture of tests/conftest.py). Processes a launcher starts in sessions of their own record their
    pid in a folder of the test; `kill_recorded` ends them.
  * No process inherits a launcher's variables from whoever runs pytest (`clean_env`); ranks get one
    thread, unbuffered output and a 20 s collective timeout unless the test says otherwise (`rank_env`).
  * At the end of the session tests/conftest.py fails the run if any process started here is still
    alive or a /dev/shm/cyxwiz* segment was left behind (`leftovers`).

    def test_sum(ranks):
        results = ranks.run(CODE, world_size=2)        # waits; kills everything on timeout
        assert all(r.rc == 0 for r in results), ranks.report(results)

`CODE` is a Python script run by every rank with RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT
(free), DISTRIBUTED_TIMEOUT_MS (20 s unless given) in its environment (`Ranks.env`).

tests/ is on sys.path (pyproject.toml's pythonpath): `from harness import ...` works in every folder.
Standard library only: the direct GPU checks (tests/gpu/checks) import it outside pytest.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

# Variables a test process must not inherit from whoever runs pytest (a CI job inside Slurm, a shell
# with RANK set, a tuned thread count): a launcher's identity, our own settings, thread counts.
_INHERITED = re.compile(
    r"RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|MASTER_ADDR|MASTER_PORT|MPI_LOCALRANKID"
    r"|(TORCHELASTIC|SLURM|OMPI|PMI|PMIX|DISTRIBUTED|CYXWIZ|QUICKSTART)_.*"
    r"|OMP_NUM_THREADS|OPENBLAS_NUM_THREADS|OPENBLAS_DEFAULT_NUM_THREADS|GOTO_NUM_THREADS")
# ...except which CUDA library to load (the host emulator of tests/gpu) and which transport the ranks
# use (CYXWIZ_TRANSPORT=tcp pytest runs the suite over TCP): they are what is under test.
_KEPT = re.compile(r"CYXWIZ_CUDA_LIBRARY|CYXWIZ_EMULATED_.*|CYXWIZ_TRANSPORT")

# What a rank gets unless the test says otherwise: one compute thread (ranks share a few cores), output
# as it is printed, and a collective timeout short enough that a hang fails the test, not the session.
RANK_DEFAULTS = {"CYXWIZ_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DISTRIBUTED_TIMEOUT_MS": "20000"}

UNSET = "<unset>"  # as a value in `extra`: the variable is absent

SHM_PATTERN = "cyxwiz*"  # our shared-memory segments, under /dev/shm

POSIX = os.name == "posix"  # process groups and sessions; elsewhere a process is killed alone

_started: list[subprocess.Popen] = []  # every process started here, for `leftovers`


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the test binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict[str, str]:
    """os.environ without the variables above, then `extra` (values made strings; UNSET removes)."""
    env = {k: v for k, v in os.environ.items() if _KEPT.fullmatch(k) or not _INHERITED.fullmatch(k)}
    env.update({k: str(v) for k, v in extra.items()})
    return {k: v for k, v in env.items() if v != UNSET}


def rank_env(**extra) -> dict[str, str]:
    """clean_env with RANK_DEFAULTS, then `extra`."""
    return clean_env(**{**RANK_DEFAULTS, **extra})


def kill_group(pgid: int) -> None:
    """SIGCONT then SIGKILL to process group `pgid` (a stopped process dies of SIGKILL only once
    resumed); a group already gone is fine. Safe after its leader exited: a pid is not reused while
    its group has members."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except OSError:  # gone, or not ours any more
            pass


def kill(pid: int) -> None:
    """kill_group(pid), then the process itself (it may lead no group): only for a live process of ours."""
    kill_group(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def alive(pid: int, owner: Path) -> bool:
    """`pid` runs, is no zombie, and is this test's (its command line or working folder names `owner`):
    a recycled pid is someone else's."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    proc = Path(f"/proc/{pid}")
    if not proc.exists():  # no /proc: trust the pid
        return True
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        cmdline = (proc / "cmdline").read_bytes().decode("utf-8", "replace")
        cwd = os.readlink(proc / "cwd")
    except OSError:
        return False
    return str(owner) in cmdline or cwd.startswith(str(owner))


def kill_recorded(pid_dir: Path, owner: Path) -> list[int]:
    """Kills the processes that wrote their pid as a file name into `pid_dir` (ranks that a launcher
    started in sessions of their own) and are still alive; returns their pids (none: the launcher
    cleaned up after itself)."""
    left = [int(f.name) for f in pid_dir.glob("*") if f.name.isdigit() and alive(int(f.name), owner)]
    for pid in left:
        kill(pid)
    return left


@dataclass
class Result:
    rank: int | None  # None: a command that is no rank
    rc: int | None    # None: still running when the test stopped waiting (then killed)
    out: str
    err: str


class Ranks:
    """Starts processes for one test and guarantees they are gone when it ends (`cleanup`)."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()  # MASTER_PORT of the ranks; a test running several jobs takes a new one

    def popen(self, cmd: list, env: dict[str, str], *, rank: int | None = None, cwd: Path | None = None,
              text: bool = True) -> subprocess.Popen:
        """Starts any command in a session of its own, output piped, tracked for cleanup."""
        p = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd or self.tmp_path, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, start_new_session=True)
        p.rank = rank  # type: ignore[attr-defined]
        self.procs.append(p)
        _started.append(p)
        return p

    def env(self, rank: int, world_size: int, extra: dict | None = None) -> dict[str, str]:
        """rank_env with this rank's identity in a job on 127.0.0.1:self.port, then `extra`."""
        return rank_env(**{"RANK": rank, "WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": self.port, **(extra or {})})

    def script(self, code: str, name: str = "rank_script.py") -> Path:
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(code))
        return path

    def start(self, code: str, world_size: int, *, ranks=None, env: dict | None = None,
              rank_env: dict | None = None, name: str = "rank_script.py") -> list[subprocess.Popen]:
        """Starts `ranks` (default: all) of `code` without waiting. rank_env: {rank: {VAR: value}}."""
        path = self.script(code, name)
        started = []
        for r in range(world_size) if ranks is None else ranks:
            e = self.env(r, world_size, {**(env or {}), **(rank_env or {}).get(r, {})})
            started.append(self.popen([sys.executable, path], e, rank=r))
        return started

    def wait(self, procs: list[subprocess.Popen], timeout: float = 60) -> list[Result]:
        """Waits for all (one shared deadline); a process still running at the deadline is killed."""
        deadline = time.monotonic() + timeout
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                results.append(Result(p.rank, p.returncode, out, err))  # type: ignore[attr-defined]
            except subprocess.TimeoutExpired:
                self.kill(p)
                out, err = p.communicate()
                results.append(Result(p.rank, None, out, err))  # type: ignore[attr-defined]
        return results

    def run(self, code: str, world_size: int, *, timeout: float = 60, **kw) -> list[Result]:
        return self.wait(self.start(code, world_size, **kw), timeout)

    def finish(self, p: subprocess.Popen, timeout: float = 60, *, check: bool = False) -> Result:
        """Waits for one process; fails the test (with its output) if it outlives `timeout` or, with
        `check`, exits non-zero."""
        [r] = self.wait([p], timeout)
        assert r.rc is not None, f"timed out after {timeout} s: {p.args}\n--- stdout\n{r.out}\n--- stderr\n{r.err}"
        assert not check or r.rc == 0, f"{p.args} exited {r.rc}\n--- stdout\n{r.out}\n--- stderr\n{r.err}"
        return r

    def command(self, cmd: list, env: dict[str, str], *, timeout: float = 60,
                cwd: Path | None = None) -> tuple[str, str]:
        """Runs one command to its end, which must be exit status 0 (`finish`); its stdout and stderr."""
        r = self.finish(self.popen(cmd, env, cwd=cwd), timeout, check=True)
        return r.out, r.err

    @staticmethod
    def report(results: list[Result]) -> str:
        return "\n".join(f"--- rank {r.rank} rc={r.rc}\n{r.out}\n{r.err}" for r in results)

    @staticmethod
    def kill(p: subprocess.Popen) -> None:
        """Kills a process started here, its group and whatever else runs in its session."""
        end_sessions([p])

    def cleanup(self) -> None:
        end_sessions(self.procs)
        for p in self.procs:
            try:
                p.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):  # ValueError: its pipes were read elsewhere
                pass


def shm_segments() -> set[str]:
    return {str(p) for p in Path("/dev/shm").glob(SHM_PATTERN)} if Path("/dev/shm").is_dir() else set()


def _session_members(sids: set[int]) -> list[int]:
    """Live processes (not zombies) of the sessions `sids`: the descendants a killed group left behind
    (Linux; elsewhere none are found)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) in sids:  # state, ppid, pgrp, session
            found.append(int(stat.parent.name))
    return found


def end_sessions(procs: list[subprocess.Popen]) -> None:
    """Kills `procs` that still run, with their groups, and every process still in their sessions (a
    child that left its group holds their pipes open). Right after the test: a session id is not reused
    while it has members, and its number comes round again only after pid_max (32768 here) new pids."""
    if not POSIX:
        for p in procs:
            if p.poll() is None:
                p.kill()
        return
    for pid in [p.pid for p in procs if p.poll() is None] + _session_members({p.pid for p in procs}):
        kill(pid)


def leftovers(segments_before: set[str]) -> list[str]:
    """What the session leaves behind, killing it: processes started here that still run (and what
    runs in their sessions), and /dev/shm/cyxwiz* segments that did not exist at `segments_before`
    (segments of another test session running on the same machine at the same time included). The
    sessions of processes that ended were emptied when their test ended; their ids may be reused now."""
    running = [p for p in _started if p.poll() is None]
    problems = [f"process {p.pid} is still running: {' '.join(map(str, p.args))}" for p in running]
    members = set(_session_members({p.pid for p in running})) - {p.pid for p in running}
    problems += [f"process {pid} is still running in the session of a test's process" for pid in sorted(members)]
    end_sessions(running)
    problems += [f"shared-memory segment {s} was left behind" for s in sorted(shm_segments() - segments_before)]
    return problems
