"""Multi-process test harness: real processes on 127.0.0.1, a free port per test, a hard timeout,
and every process killed at the end of the test, even when it fails.

    def test_sum(ranks):
        results = ranks.run(CODE, world_size=2)          # waits; kills everything on timeout
        assert all(r.rc == 0 for r in results), ranks.report(results)

`CODE` is a Python script run by every rank with RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1,
MASTER_PORT (free), DISTRIBUTED_TIMEOUT_MS (20 s unless given) in its environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    rank: int
    rc: int | None  # None: still running when the test stopped waiting (then killed)
    out: str
    err: str


class Ranks:
    """Starts rank processes and guarantees they are gone when the test ends."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()

    def env(self, rank: int, world_size: int, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_"))
               and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CYXWIZ_JOB_ID",
                             "DISTRIBUTED_BACKEND", "DISTRIBUTED_TIMEOUT_MS")}
        env.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(self.port), "DISTRIBUTED_TIMEOUT_MS": "20000",
                    "CYXWIZ_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return {k: v for k, v in env.items() if v != "<unset>"}

    def script(self, code: str, name: str = "rank_script.py") -> Path:
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(code))
        return path

    def start(self, code: str, world_size: int, *, ranks=None, env: dict | None = None,
              rank_env: dict | None = None, name: str = "rank_script.py") -> list[subprocess.Popen]:
        """Starts `ranks` (default: all) without waiting. rank_env: {rank: {VAR: value}}."""
        path = self.script(code, name)
        started = []
        for r in (range(world_size) if ranks is None else ranks):
            e = self.env(r, world_size, {**(env or {}), **((rank_env or {}).get(r, {}))})
            p = subprocess.Popen([sys.executable, str(path)], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True, cwd=self.tmp_path)
            p.rank = r  # type: ignore[attr-defined]
            self.procs.append(p)
            started.append(p)
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
                self._kill(p)
                out, err = p.communicate()
                results.append(Result(p.rank, None, out, err))  # type: ignore[attr-defined]
        return results

    def run(self, code: str, world_size: int, *, timeout: float = 60, **kw) -> list[Result]:
        return self.wait(self.start(code, world_size, **kw), timeout)

    @staticmethod
    def report(results: list[Result]) -> str:
        return "\n".join(f"--- rank {r.rank} rc={r.rc}\n{r.out}\n{r.err}" for r in results)

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)  # a stopped process cannot die of SIGKILL until resumed
                except (ProcessLookupError, PermissionError):
                    pass
                self._kill(p)
            try:
                p.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()
