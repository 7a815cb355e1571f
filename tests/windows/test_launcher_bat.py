"""launch_distributed.bat under Wine's cmd, with tools/windows/argv_recorder.exe as the interpreter
(PYTHON=<recorder>): the arguments after N reach `python -m pycyxwiz.launch --nproc-per-node N
[LAUNCH_ARGS] -- script.py args...` intact, as the program's C runtime parses them (what python.exe's
sys.argv gets), and a bad N prints the usage on stderr and exits 2.

Two forms of call: `wine cmd /c launch_distributed.bat ARGS...` from Linux, where Wine itself turns
the argument list into a command line (quoting an argument that has a space, tab or quote, a quote
written \\"), and a driver .bat holding one exact line as a user would type it in cmd.

Both bugs these tests found are fixed in the script: a `findstr /r "^[1-9][0-9]*$"` check of N
refused every N under Wine (Wine's findstr has no [...] classes; Wine 8's cmd runs the right side of
|| whatever the status), and `if "%~1"=="" goto run` ended the arguments at an empty one ("" and all
after it were dropped; cmd's %~1 does that on Windows too).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import UNSET
from wintools import REPO, run, win_path

USAGE = "usage: launch_distributed.bat N script.py [args...]"

def crlf(lines: list[str]) -> str:
    return "".join(line + "\r\n" for line in lines)


@dataclass
class Launch:
    rc: int
    out: str
    err: str
    record: dict | None  # what argv_recorder.exe wrote; None: it did not run

    def tail(self) -> list[str]:
        """The C runtime's argv after the program name."""
        assert self.record is not None, f"the interpreter did not run: rc={self.rc}\n{self.out}\n{self.err}"
        # The two parses (shell32's CommandLineToArgvW, the C runtime's) agree on everything here.
        assert self.record["argv"][1:] == self.record["crt_argv"][1:], self.record
        return self.record["crt_argv"][1:]


class Launcher:
    """Runs launch_distributed.bat under wine cmd, argv_recorder.exe as PYTHON."""

    def __init__(self, wine, ranks, recorder: Path, tmp_path: Path):
        self.wine, self.ranks, self.recorder, self.tmp_path = wine, ranks, recorder, tmp_path
        self.record = tmp_path / "record.json"

    def _run(self, cmd: list, env: dict) -> Launch:
        self.record.unlink(missing_ok=True)
        env = {"PYTHON": win_path(self.recorder), "ARGV_RECORD": win_path(self.record), **env}
        r = run(self.ranks, [self.wine.exe, *cmd], self.wine.env_with(**env), timeout=60, cwd=REPO,
                check=False)
        record = json.loads(self.record.read_text(encoding="utf-8")) if self.record.exists() else None
        return Launch(r.rc, r.out, r.err, record)

    def args(self, args: list[str], **env) -> Launch:
        """wine cmd /c launch_distributed.bat ARGS: Wine writes the command line from the list."""
        return self._run(["cmd", "/c", "launch_distributed.bat", *args], env)

    def line(self, line: str, **env) -> Launch:
        """One exact cmd line in a driver .bat (no `call`: under Wine 8 a called script's exit /b N
        reaches the caller as errorlevel 1)."""
        driver = self.tmp_path / "driver.bat"
        driver.write_bytes(crlf(["@echo off", line]).encode())
        return self._run(["cmd", "/c", win_path(driver)], env)


@pytest.fixture
def launcher(wine, ranks, argv_recorder, tmp_path) -> Launcher:
    return Launcher(wine, ranks, argv_recorder, tmp_path)


def launch_argv(n: str, rest: list[str], launch_args: list[str] = ()) -> list[str]:
    return ["-m", "pycyxwiz.launch", "--nproc-per-node", n, *launch_args, "--", *rest]


@pytest.mark.parametrize("n, rest", [
    ("3", ["train.py", "--epochs", "3"]),
    ("3", ["train.py", "--name", "a b", 'quote"d']),
    ("4", ["train.py", 'quote"d', "--name", "a b", "tail"]),
    ("12", ["my dir\\train.py", "--out", "C:\\some path\\", "--tab", "a\tb"]),
], ids=["plain", "space-and-quote", "quote-then-more", "paths-backslashes-tab"])
def test_arguments_reach_the_launcher(launcher, n, rest):
    r = launcher.args([n, *rest])
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.tail() == launch_argv(n, rest)
    assert f"argv_recorder: {len(launch_argv(n, rest))} arguments" in r.out  # its console output reaches us
    assert r.err == ""


@pytest.mark.parametrize("line, rest", [
    ('launch_distributed.bat 3 train.py --name "a b" "quote\\"d" "he said \\"hi\\"" tail',
     ["train.py", "--name", "a b", 'quote"d', 'he said "hi"', "tail"]),
    ('launch_distributed.bat 2 train.py "a,b" "x=y" "k;v" "a&b" "c|d" "e>f" "(x)"',
     ["train.py", "a,b", "x=y", "k;v", "a&b", "c|d", "e>f", "(x)"]),
], ids=["escaped-quotes", "cmd-special-characters-quoted"])
def test_exact_command_lines(launcher, line, rest):
    r = launcher.line(line)
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.tail() == launch_argv(line.split()[1], rest)


def test_empty_arguments_are_kept(launcher):
    r = launcher.line('launch_distributed.bat 3 train.py "" after ""')
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.tail() == launch_argv("3", ["train.py", "", "after", ""])


def test_unquoted_comma_semicolon_equals_split_arguments(launcher):
    """cmd's rule for batch parameters (%1...), on Windows as under Wine: an unquoted , ; or = separates
    arguments like a space. --lr=0.1 still means the same to argparse; a,b does not: quote it."""
    r = launcher.args(["3", "train.py", "--lr=0.1", "a,b", "x;y"])
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.tail() == launch_argv("3", ["train.py", "--lr", "0.1", "a", "b", "x", "y"])


def test_launch_args_pass_through(launcher):
    launch_args = "--master-port 29600 --master-addr 127.0.0.1"
    r = launcher.args(["2", "train.py", "--epochs", "1"], LAUNCH_ARGS=launch_args)
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.tail() == launch_argv("2", ["train.py", "--epochs", "1"], launch_args.split())
    assert r.record["env"]["LAUNCH_ARGS"] == launch_args


def test_exit_status_passes_through(launcher):
    r = launcher.args(["2", "train.py"], ARGV_RECORD_EXIT="7")
    assert r.record is not None and r.rc == 7, f"rc={r.rc}\n{r.out}\n{r.err}"


def test_missing_interpreter_exits_9009(launcher, tmp_path):
    """cmd's "not found" status 9009 passes through exit /b %ERRORLEVEL%; a Unix exit status keeps its
    low byte: 9009 % 256 = 49."""
    r = launcher.args(["2", "train.py"], PYTHON=win_path(tmp_path / "no such dir" / "python.exe"))
    assert r.record is None
    assert r.rc == 9009 % 256, f"rc={r.rc}\n{r.out}\n{r.err}"


def test_default_interpreter_is_python_from_the_path(launcher, argv_recorder, tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy2(argv_recorder, folder / "python.exe")
    r = launcher.args(["2", "train.py"], PYTHON=UNSET, WINEPATH=win_path(folder))
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.record["crt_argv"][0] == "python"
    assert r.tail() == launch_argv("2", ["train.py"])


def check_usage(r: Launch) -> None:
    assert r.rc == 2, f"rc={r.rc}\n{r.out}\n{r.err}"
    assert r.record is None, "the interpreter ran"
    assert r.out == "", r.out
    lines = r.err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(USAGE) and "N: processes to start" in lines[1], r.err


@pytest.mark.parametrize("args", [
    ["0", "train.py"], ["-1", "train.py"], ["abc", "train.py"], ["3x", "train.py"], ["01", "train.py"],
    [" 3", "train.py"], ["", "train.py"], ["3"], [],
], ids=["zero", "negative", "word", "trailing-letter", "leading-zero", "leading-space", "empty", "no-script",
        "nothing"])
def test_bad_n_prints_usage_and_exits_2(launcher, args):
    check_usage(launcher.args(args))


def test_bad_n_quoted_semicolon(launcher):
    """";3" (quoted, so cmd does not take the ; for a separator) is no number: for /f's default comment
    character is ;, which the check replaces (eol=0)."""
    check_usage(launcher.line('launch_distributed.bat ";3" train.py'))
