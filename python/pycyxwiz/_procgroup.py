"""Process groups of ranks (POSIX): stop every process in them, and a watchdog that does so when the
process that started the ranks (the launcher, spawn) dies without a chance to clean up (SIGKILL).

Each rank leads its own process group, so everything it starts (data loaders, shell commands) is
signalled with it, even after the rank itself has exited. The watchdog is a separate small process
(this file, run by path: standard library only, no preexec_fn, so starting ranks from threads stays
safe): it learns the ranks' group ids through a pipe and, when the pipe reports end of file without
a goodbye (its parent is gone), stops those groups as the parent would have.

Windows has neither: there each rank leads a console process group (CTRL_BREAK_EVENT) and is in a job
object that Windows ends with its parent (_winjob, which this file does not import: it runs by path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable, Optional

SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)
_POLL = 0.05


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies waiting for their reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id now belongs to someone else's group: not ours to stop
        return False
    if not os.path.isdir("/proc"):
        return True
    for entry in os.scandir("/proc"):  # Linux: look past zombies (a container's init may never reap them)
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def wait_unreaped(pid: int, wait: Callable[[], int]) -> int:
    """Waits for child `pid` to exit and returns its status as Popen.returncode does (-signal when
    killed), but leaves it a zombie: until it is reaped (`wait`, called later) its pid, which is its
    process group's id, cannot be reused, so a later killpg reaches only what it left behind.
    Reaps at once (wait()) where zombies cannot be told from live processes (no /proc)."""
    if not hasattr(os, "waitid") or not os.path.isdir("/proc"):
        return wait()
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return wait()
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _signal_groups(pgids: Iterable[int], signum: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signum)
        except OSError:  # gone meanwhile
            pass


def stop_groups(pgids: Iterable[int], grace: float, first: int = signal.SIGTERM,
                hurry: Optional[Callable[[], bool]] = None) -> list[int]:
    """`first` to every process group still alive, SIGKILL to those alive after `grace` seconds (or
    as soon as hurry() says so); returns the groups that were alive at the start."""
    alive = [g for g in pgids if group_alive(g)]
    if not alive:
        return []
    _signal_groups(alive, first)
    left = alive
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline and not (hurry and hurry()):
        time.sleep(_POLL)
        left = [g for g in left if group_alive(g)]
    if left:
        _signal_groups(left, SIGKILL)
        deadline = time.monotonic() + 5.0  # SIGKILL cannot be caught; only a hung kernel call delays it
        while left and time.monotonic() < deadline:
            time.sleep(_POLL)
            left = [g for g in left if group_alive(g)]
    return alive


class Watchdog:
    """The parent's side: watch(pgid) after starting a rank, forget(pgid) once its group is stopped,
    close() at the end. A no-op where there are no process groups (Windows: there a job object with
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, see _winjob, ends the ranks when their parent dies)."""

    def __init__(self, grace: float, who: str) -> None:
        self._proc: Optional[subprocess.Popen] = None
        if os.name != "posix":
            return
        # Its own session: a Ctrl-C or a kill of the parent's process group leaves it to do its job.
        # stdin is the only pipe; its write end is ours alone (not inheritable), so EOF means we are gone.
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), f"{grace:g}", who],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:  # no process to spare: the parent still stops its ranks itself, as before
            self._proc = None

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):  # the watchdog died: the parent still stops its ranks itself
            stdin, self._proc.stdin = self._proc.stdin, None
            try:
                stdin.close()
            except OSError:
                pass

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Every group was stopped by the parent: the watchdog leaves without touching anything."""
        if self._proc is None:
            return
        self._send("bye")
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


def _watch(grace: float, who: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    groups: dict[int, None] = {}
    for line in sys.stdin.buffer:
        word = line.strip().decode("ascii", "replace")
        if word == "bye":
            return
        if word[:1] in "+-" and word[1:].isdigit():
            if word[0] == "+":
                groups[int(word[1:])] = None
            else:
                groups.pop(int(word[1:]), None)
    alive = [g for g in groups if group_alive(g)]
    if alive:
        sys.stderr.write(f"{who} died: stopping the process groups {alive} of its ranks "
                         f"(SIGTERM, SIGKILL after {grace:g}s)\n")
        sys.stderr.flush()
        stop_groups(alive, grace)


if __name__ == "__main__":
    _watch(float(sys.argv[1]), sys.argv[2])
