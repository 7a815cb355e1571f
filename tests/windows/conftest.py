"""Fixtures of tests/windows: the Windows build groundwork (tools/windows/README.md), checked on Linux
with MinGW-w64 and Wine. Every test here skips, with the reason, where the cross compiler or wine is
missing; nothing here needs a Windows Python.

    mingw_cxx     the path of x86_64-w64-mingw32-g++-posix (skips without it)
    wine          a Wine: its command and the environment to run it in (skips without it)
    win_procs     a harness.Ranks for the session's builds: every command runs in a session of its
                  own under a hard timeout and is killed, with its group, if it outlives it
    argv_recorder tools/windows/argv_recorder.cpp built into an .exe (once per session)

Wine runs in one prefix kept between sessions (created on first use, about 5 s, ~700 MB), so a run
costs no prefix creation and never touches ~/.wine: $CYXWIZ_WINEPREFIX, else <cache>/wineprefix, where
<cache> is $CYXWIZ_WINDOWS_CACHE, else $XDG_CACHE_HOME/pycyxwiz-windows (~/.cache/...). Its creation
runs under a file lock, so concurrent sessions do not race on it; wine processes of concurrent
sessions then share one wineserver, which is how Wine works anyway. WINEDEBUG=-all keeps Wine's
fixme/err lines (and Debian's "wine32 is missing" hint) out of stderr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness import UNSET, Ranks, clean_env, end_sessions
from wintools import MINGW_CXX, TOOLS, Wine, cache_root, file_lock, run, win_path


@pytest.fixture(scope="session")
def win_procs(tmp_path_factory):
    r = Ranks(tmp_path_factory.mktemp("windows"))
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture(scope="session")
def mingw_cxx() -> str:
    path = shutil.which(MINGW_CXX)
    if not path:
        pytest.skip(f"{MINGW_CXX} not found (Debian: apt-get install g++-mingw-w64-x86-64-posix)")
    return path


@pytest.fixture(scope="session")
def wine(win_procs):
    exe = shutil.which("wine") or shutil.which("wine64")
    if not exe:
        pytest.skip("wine not found (Debian: apt-get install wine64)")
    prefix = Path(os.environ.get("CYXWIZ_WINEPREFIX") or cache_root() / "wineprefix")
    env = clean_env(
        WINEPREFIX=prefix, WINEDEBUG="-all",
        # No Mono/Gecko installer at prefix creation (none is needed, and none could be downloaded).
        WINEDLLOVERRIDES="mscoree,mshtml=",
        # Console programs only: no window may open, whatever the caller's session has.
        DISPLAY=UNSET, WAYLAND_DISPLAY=UNSET,
        # Nothing the launcher tests set themselves may come from whoever runs pytest.
        PYTHON=UNSET, LAUNCH_ARGS=UNSET, WINEPATH=UNSET,
        ARGV_RECORD=UNSET, ARGV_RECORD_ENV=UNSET, ARGV_RECORD_EXIT=UNSET)
    wineserver = shutil.which("wineserver")
    with file_lock(prefix.parent / (prefix.name + ".lock"), timeout=300):
        if not (prefix / "system.reg").exists():
            run(win_procs, [exe, "cmd", "/c", "exit", "0"], env, timeout=180)
            if wineserver:  # let wineboot's first start finish before anyone uses the prefix
                run(win_procs, [wineserver, "-w"], env, timeout=60, check=False)
    z = prefix / "dosdevices" / "z:"
    assert z.exists() and z.resolve() == Path("/"), f"{z} is not the Linux root: win_path() would be wrong"
    # A wine process kept open for the session (cmd reading a pipe we hold) keeps the wineserver and
    # Wine's service processes running between tests: without it every wine call starts them anew
    # (~1 s), and they inherit that call's stdout/stderr, so reading its output to the end waits until
    # they exit too (another 1-2 s). The keeper's own output goes nowhere, so the services it starts
    # hold no pipe of ours. They start with the first wine process of a prefix, before its program
    # runs: once the keeper has run a command (written `ready`), no later call starts them.
    ready = win_procs.tmp_path / "wine-keeper-ready"
    keeper = subprocess.Popen([exe, "cmd"], env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    win_procs.procs.append(keeper)
    try:
        keeper.stdin.write(f'echo ready>"{win_path(ready)}"\r\n'.encode())
        keeper.stdin.flush()
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert keeper.poll() is None, f"wine cmd exited {keeper.returncode} at its start"
            assert time.monotonic() < deadline, "wine cmd did not run a command within 120 s"
            time.sleep(0.05)
        yield Wine(exe, env, prefix)
    finally:
        keeper.stdin.close()  # end of input: cmd exits
        try:
            keeper.wait(timeout=15)
        except subprocess.TimeoutExpired:
            end_sessions([keeper])
            keeper.wait(timeout=15)
        if wineserver:
            # The wineserver (and Wine's service processes) end a moment after the last wine process
            # of the prefix: wait for that, but never kill it, another session may be using the prefix.
            w = win_procs.popen([wineserver, "-w"], env)
            win_procs.wait([w], timeout=15)


@pytest.fixture(scope="session")
def argv_recorder(win_procs, mingw_cxx, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("argv_recorder") / "argv_recorder.exe"
    run(win_procs, [mingw_cxx, "-std=c++17", "-O1", "-municode", "-static", "-Wall", "-Wextra", "-Werror",
                    TOOLS / "argv_recorder.cpp", "-o", out], clean_env(), timeout=120)
    return out
