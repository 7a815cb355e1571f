"""Helpers of tests/windows (its conftest.py has the fixtures): paths, the cache folder, Linux paths
as Wine sees them, a file lock, and `run`, one command under a hard timeout."""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import UNSET, Ranks, Result

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "windows"
MINGW_CXX = "x86_64-w64-mingw32-g++-posix"


def cache_root() -> Path:
    if os.environ.get("CYXWIZ_WINDOWS_CACHE"):
        return Path(os.environ["CYXWIZ_WINDOWS_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "pycyxwiz-windows"


def win_path(path: Path) -> str:
    """The Windows name of a Linux path in a Wine prefix (drive Z: is the Linux root)."""
    return "Z:" + str(Path(path).resolve()).replace("/", "\\")


@contextmanager
def file_lock(path: Path, timeout: float):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{path} stayed locked for {timeout} s")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run(procs: Ranks, cmd: list, env: dict[str, str], *, timeout: float, cwd: Path | None = None,
        check: bool = True) -> Result:
    """One command to its end under a hard timeout (killed with its group past it: the test fails);
    with `check`, a non-zero exit fails the test with the output."""
    r = procs.finish(procs.popen(cmd, env, cwd=cwd), timeout)
    if check and r.rc != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.rc}\n--- stdout\n{r.out}\n--- stderr\n{r.err}")
    return r


@dataclass
class Wine:
    exe: str          # the wine command
    env: dict         # the environment to run it in: WINEPREFIX, WINEDEBUG=-all, no display
    prefix: Path

    def env_with(self, **extra) -> dict[str, str]:
        env = {**self.env, **{k: str(v) for k, v in extra.items()}}
        return {k: v for k, v in env.items() if v != UNSET}
