"""python -m pycyxwiz.launch and launch_distributed.sh with real processes: each test writes a tiny
rank script into tmp_path, runs the launcher with a hard timeout, fails if a rank outlived the
launcher, and kills whatever it started."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import alive, clean_env, free_port, kill, kill_group, kill_recorded

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "pycyxwiz.launch"]
TIMEOUT = 60
POSIX = os.name == "posix"
posix_only = pytest.mark.skipif(not POSIX, reason="POSIX signals and process groups")

# Every rank script starts like this: it records its pid (pids/<pid> holds the rank) so a test can
# check that ranks are gone and clean up ranks that a broken launcher left behind.
PREAMBLE = """\
import json, os, signal, sys, time
from pathlib import Path
HERE = Path(__file__).resolve().parent
RANK = int(os.environ["RANK"])
(HERE / "pids").mkdir(exist_ok=True)
(HERE / "pids" / str(os.getpid())).write_text(str(RANK))

def wait_for(*names):
    deadline = time.time() + 30
    while not all((HERE / n).exists() for n in names) and time.time() < deadline:
        time.sleep(0.02)
"""

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "CYXWIZ_JOB_ID", "CYXWIZ_SECRET", "CYXWIZ_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
            "PYTHONUNBUFFERED", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "PMI_SIZE")
ENV_DUMP = f"""
out = Path(sys.argv[1])
out.mkdir(exist_ok=True)
(out / f"{{RANK}}.json").write_text(json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS!r}}}))
"""


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(PREAMBLE + textwrap.dedent(body))
    return path


def rank_pids(tmp_path: Path) -> dict[int, int]:
    """rank -> pid of every rank that started."""
    pids = tmp_path / "pids"
    return {int(p.read_text()): int(p.name) for p in pids.iterdir()} if pids.exists() else {}


def kill_leftovers(ranks, proc: subprocess.Popen) -> list[int]:
    """Kill what is still running; return the ranks' pids that were (none, after a good launcher)."""
    if not POSIX:
        proc.kill()
        return []
    kill_group(proc.pid)
    return kill_recorded(ranks.tmp_path / "pids", ranks.tmp_path)  # ranks live in their own sessions


def start(ranks, args: list[str], env: dict[str, str] | None = None,
          command: list[str] | None = None) -> subprocess.Popen:
    return ranks.popen((command or LAUNCH) + args, env or clean_env(), text=False)


def finish(ranks, proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """Wait for the launcher (hard timeout), then check that it left no rank running."""
    try:
        [result] = ranks.wait([proc], TIMEOUT)  # kills the launcher at the deadline
    finally:
        left = kill_leftovers(ranks, proc)
    stderr = result.err.decode("utf-8", "replace")
    assert result.rc is not None, f"the launcher did not finish within {TIMEOUT} s; its stderr:\n{stderr}"
    assert not left, f"the launcher exited but left ranks running (pids {left}); its stderr:\n{stderr}"
    return subprocess.CompletedProcess(proc.args, result.rc, result.out, stderr)


def launch(ranks, args: list[str], env: dict[str, str] | None = None,
           command: list[str] | None = None) -> subprocess.CompletedProcess:
    return finish(ranks, start(ranks, args, env, command))


def read_envs(out: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}


def wait_for_files(paths: list[Path], proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, "the launcher exited before its ranks were ready"
        assert time.monotonic() < deadline, f"ranks not ready: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.02)


# ------------------------------------------------------------------------------ what each rank sees


@pytest.mark.parametrize("n", [1, 3])
def test_each_rank_gets_its_environment(ranks, tmp_path, n):
    s = script(tmp_path, "env.py", ENV_DUMP)
    port = free_port()
    env = clean_env(RANK="7", SLURM_PROCID="5", SLURM_NTASKS="8", OMPI_COMM_WORLD_RANK="3", PMI_SIZE="9")
    result = launch(ranks, ["--nproc-per-node", str(n), "--master-port", str(port), str(s), str(tmp_path / "a")],
                    env)
    assert result.returncode == 0, result.stderr
    envs = read_envs(tmp_path / "a")
    assert set(envs) == set(range(n))
    job_ids = {e["CYXWIZ_JOB_ID"] for e in envs.values()}
    assert len(job_ids) == 1 and re.fullmatch(r"[0-9a-f]{16}", job_ids.pop())
    for rank, e in envs.items():
        assert e["RANK"] == e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == str(n)
        assert e["NODE_RANK"] == e["GROUP_RANK"] == "0"
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert e["CYXWIZ_RESTART_COUNT"] == e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["SLURM_PROCID"] is e["SLURM_NTASKS"] is e["OMPI_COMM_WORLD_RANK"] is e["PMI_SIZE"] is None
    assert f"world size {n}" in result.stderr and f"127.0.0.1:{port}" in result.stderr
    assert envs[0]["CYXWIZ_JOB_ID"] in result.stderr

    if n > 1:  # a second launch is another job
        again = launch(ranks, ["--nproc-per-node", str(n), "--master-port", str(port), str(s), str(tmp_path / "b")],
                       env)
        assert again.returncode == 0, again.stderr
        assert read_envs(tmp_path / "b")[0]["CYXWIZ_JOB_ID"] != envs[0]["CYXWIZ_JOB_ID"]


OUTPUT = """
sys.stdout.write(f"first from {RANK}\\n")
sys.stderr.write(f"warning from {RANK}\\n")
sys.stdout.write("part-"); sys.stdout.flush(); time.sleep(0.2); sys.stdout.write("one\\n")
sys.stdout.flush()
sys.stdout.buffer.write(b"bytes \\xff\\xfe end\\n")
sys.stdout.write("no newline at the end")
"""


def test_every_line_is_prefixed_with_its_rank_on_the_same_stream(ranks, tmp_path):
    s = script(tmp_path, "out.py", OUTPUT)
    result = launch(ranks, ["--nproc-per-node", "2", "--master-port", str(free_port()), str(s)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split(b"\n")
    assert lines.pop() == b""  # the unterminated last line was given its newline
    assert all(re.match(rb"\[rank [01]\] ", line) for line in lines), lines
    for r in (0, 1):
        for text in (b"first from %d" % r, b"part-one", b"bytes \xff\xfe end", b"no newline at the end"):
            assert b"[rank %d] " % r + text in lines
        assert f"[rank {r}] warning from {r}" in result.stderr.splitlines()
    assert b"warning" not in result.stdout
    assert all(line.startswith(("[rank ", "[launch] ")) for line in result.stderr.splitlines())


def test_no_prefix_passes_output_through_unchanged(ranks, tmp_path):
    s = script(tmp_path, "out.py", OUTPUT)
    result = launch(ranks, ["--nproc-per-node", "1", "--no-prefix", "--master-port", str(free_port()), str(s)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"first from 0\npart-one\nbytes \xff\xfe end\nno newline at the end"
    assert "warning from 0" in result.stderr.splitlines()


@pytest.mark.parametrize("form", ["script", "command", "module"])
def test_script_command_and_module_targets_get_their_own_flags(ranks, tmp_path, form):
    s = script(tmp_path, "argsmod.py", 'print("ARGS " + json.dumps(sys.argv[1:]))\n')
    target_args = ["--nproc-per-node", "9", "--", "two words"]
    target = {"script": [str(s)], "command": ["--", sys.executable, str(s)], "module": ["-m", "argsmod"]}[form]
    result = launch(ranks, ["--nproc-per-node", "2", "--master-port", str(free_port()), *target, *target_args])
    assert result.returncode == 0, result.stderr
    for r in (0, 1):
        assert f"[rank {r}] ARGS {json.dumps(target_args)}".encode() in result.stdout.splitlines()
    if form == "module":
        assert "-u -m argsmod" in result.stderr


# ------------------------------------------------------------------------------- failures, signals


@posix_only
def test_failing_rank_stops_the_others_and_sets_the_exit_code(ranks, tmp_path):
    s = script(tmp_path, "fail.py", """
        if RANK == 1:
            wait_for("ready.0", "ready.2")
            print("rank 1 is failing on purpose", file=sys.stderr)
            sys.exit(3)
        if RANK == 2:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # needs the SIGKILL after --kill-timeout
        (HERE / f"ready.{RANK}").touch()
        time.sleep(600)
    """)
    began = time.monotonic()
    result = launch(ranks, ["--nproc-per-node", "3", "--kill-timeout", "1", "--master-port", str(free_port()), str(s)])
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - began < 30
    pids = rank_pids(tmp_path)
    assert f"[launch] rank 1 (local 1, pid {pids[1]}) failed with exit code 3; stopping the other 2 ranks" \
        in result.stderr
    assert "[launch]   rank 1 is failing on purpose" in result.stderr  # the summary repeats its stderr
    assert f"killing rank 2 (local 2, pid {pids[2]})" in result.stderr
    assert set(pids) == {0, 1, 2}  # and finish() found none of them running after the launcher


@posix_only
def test_rank_killed_by_a_signal_exits_128_plus_signal(ranks, tmp_path):
    s = script(tmp_path, "kill.py", """
        if RANK == 0:
            wait_for("ready.1")
            os.kill(os.getpid(), signal.SIGKILL)
        (HERE / f"ready.{RANK}").touch()
        time.sleep(600)
    """)
    result = launch(ranks, ["--nproc-per-node", "2", "--master-port", str(free_port()), str(s)])
    assert result.returncode == 137, result.stderr
    assert "was killed by SIGKILL" in result.stderr
    assert set(rank_pids(tmp_path)) == {0, 1}  # and finish() found rank 1 gone with the launcher


@posix_only
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name)
def test_signal_to_the_launcher_is_forwarded_once_to_every_rank(ranks, tmp_path, sig):
    s = script(tmp_path, "trap.py", """
        def record(signum, frame):
            with open(HERE / f"got.{RANK}", "a") as f:
                f.write(signal.Signals(signum).name + "\\n")
            sys.exit(0)
        signal.signal(signal.SIGTERM, record)
        signal.signal(signal.SIGINT, record)
        (HERE / f"ready.{RANK}").touch()
        time.sleep(600)
    """)
    proc = start(ranks, ["--nproc-per-node", "2", "--master-port", str(free_port()), str(s)])
    try:
        wait_for_files([tmp_path / "ready.0", tmp_path / "ready.1"], proc)
        os.kill(proc.pid, sig)
    finally:
        result = finish(ranks, proc)
    assert result.returncode == 128 + sig, result.stderr
    for r in (0, 1):
        assert (tmp_path / f"got.{r}").read_text() == f"{sig.name}\n"
    assert f"got {sig.name}: forwarding it to 2 ranks" in result.stderr


@posix_only
def test_second_signal_kills_ranks_that_ignore_the_first(ranks, tmp_path):
    s = script(tmp_path, "stubborn.py", """
        signal.signal(signal.SIGTERM, lambda signum, frame: (HERE / f"term.{RANK}").touch())  # and go on
        (HERE / f"ready.{RANK}").touch()
        while True:
            time.sleep(1)
    """)
    proc = start(ranks, ["--nproc-per-node", "2", "--kill-timeout", "50", "--master-port", str(free_port()), str(s)])
    try:
        wait_for_files([tmp_path / "ready.0", tmp_path / "ready.1"], proc)
        os.kill(proc.pid, signal.SIGTERM)
        wait_for_files([tmp_path / "term.0", tmp_path / "term.1"], proc)
        began = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
    finally:
        result = finish(ranks, proc)
    assert result.returncode == 143, result.stderr
    assert time.monotonic() - began < 20  # not the 50 s of --kill-timeout
    assert "a second signal to the launcher" in result.stderr


# A rank that starts a child (a data loader, a shell command) and exits: the child is in the rank's
# process group and must not outlive the launcher, whatever way the job ends.
FORKS = """
    import subprocess
    child = subprocess.Popen(["sleep", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (HERE / f"child.{RANK}").write_text(str(child.pid))
    if RANK == int(sys.argv[1]):
        wait_for("child.0", "child.1")  # both ranks have a child before this one fails and the others stop
        sys.exit(int(sys.argv[2]))
    time.sleep(600 if int(sys.argv[2]) else 0)
"""


def child_pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text()) for p in tmp_path.glob("child.*") if p.read_text()]


def kill_pids(pids: list[int], tmp_path: Path) -> None:
    for pid in pids:
        if alive(pid, tmp_path):
            kill(pid)


@posix_only
@pytest.mark.parametrize("exit_code", [0, 3], ids=["success", "failure"])
def test_children_of_ranks_that_exited_are_stopped_at_the_end(ranks, tmp_path, exit_code):
    s = script(tmp_path, "forks.py", FORKS)
    try:
        result = launch(ranks, ["--nproc-per-node", "2", "--kill-timeout", "2", "--master-port", str(free_port()),
                                str(s), "0", str(exit_code)])
        assert result.returncode == exit_code, result.stderr
        children = child_pids(tmp_path)
        assert len(children) == 2, result.stderr
        deadline = time.monotonic() + 2
        while any(alive(pid, tmp_path) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in children if alive(pid, tmp_path)]
        assert not left, f"children of ranks (pids {left}) outlived the launcher; its stderr:\n{result.stderr}"
    finally:
        kill_pids(child_pids(tmp_path), tmp_path)


@posix_only
def test_ranks_and_their_children_end_when_the_launcher_is_killed(ranks, tmp_path):
    s = script(tmp_path, "forks.py", FORKS + """
    (HERE / f"ready.{RANK}").touch()
    time.sleep(600)
    """)
    proc = start(ranks, ["--nproc-per-node", "2", "--kill-timeout", "2", "--master-port", str(free_port()), str(s),
                         "-1", "0"])
    try:
        wait_for_files([tmp_path / "ready.0", tmp_path / "ready.1"], proc)
        ours = list(rank_pids(tmp_path).values()) + child_pids(tmp_path)
        assert len(ours) == 4
        os.kill(proc.pid, signal.SIGKILL)  # as the OOM killer would: no chance to forward anything
        proc.wait(timeout=10)
        deadline = time.monotonic() + 3
        while any(alive(pid, tmp_path) for pid in ours) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in ours if alive(pid, tmp_path)]
        assert not left, f"ranks and their children (pids {left}) outlived the SIGKILLed launcher by 3 s"
        stderr = proc.communicate(timeout=10)[1].decode()
        assert f"[launch] the launcher (pid {proc.pid}) died: stopping the process groups" in stderr, stderr
    finally:
        kill_pids(child_pids(tmp_path), tmp_path)
        kill_leftovers(ranks, proc)
        proc.communicate(timeout=10)


def test_max_restarts_restarts_the_whole_group_with_a_new_job_id(ranks, tmp_path):
    s = script(tmp_path, "flaky.py", """
        attempt = os.environ["CYXWIZ_RESTART_COUNT"]
        with open(HERE / "attempts.log", "a") as f:
            f.write(f"{RANK} {attempt} {os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['CYXWIZ_JOB_ID']}\\n")
        if RANK == 1 and attempt == "0":
            sys.exit(4)
    """)
    result = launch(ranks, ["--nproc-per-node", "2", "--max-restarts", "2", "--master-port", str(free_port()), str(s)])
    assert result.returncode == 0, result.stderr
    records = [line.split() for line in (tmp_path / "attempts.log").read_text().splitlines()]
    assert all(cyx == torch for _, cyx, torch, _ in records)
    assert {attempt for _, attempt, _, _ in records} == {"0", "1"}
    assert sorted(rank for rank, attempt, _, _ in records if attempt == "1") == ["0", "1"]
    jobs = {attempt: {job for _, a, _, job in records if a == attempt} for attempt in ("0", "1")}
    assert len(jobs["0"]) == len(jobs["1"]) == 1 and jobs["0"] != jobs["1"]
    assert "failed with exit code 4" in result.stderr and "restart 1 of 2" in result.stderr


def test_restarts_run_out_and_the_failure_is_the_exit_code(ranks, tmp_path):
    s = script(tmp_path, "broken.py", """
        with open(HERE / "attempts.log", "a") as f:
            f.write(os.environ["CYXWIZ_RESTART_COUNT"] + "\\n")
        sys.exit(4)
    """)
    result = launch(ranks, ["--nproc-per-node", "1", "--max-restarts", "1", "--master-port", str(free_port()), str(s)])
    assert result.returncode == 4, result.stderr
    assert (tmp_path / "attempts.log").read_text().split() == ["0", "1"]
    assert "giving up after 1 restart" in result.stderr


# ---------------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("value", ["0", "x", "-1", None])
def test_bad_nproc_per_node_is_a_clear_error(ranks, tmp_path, value):
    s = script(tmp_path, "env.py", ENV_DUMP)
    args = [] if value is None else ["--nproc-per-node", value]
    result = launch(ranks, [*args, str(s), str(tmp_path / "a")])
    assert result.returncode == 2
    assert "--nproc-per-node" in result.stderr
    if value is not None:
        assert f"must be an integer >= 1, got '{value}'" in result.stderr
    assert not (tmp_path / "a").exists()


def test_missing_target_is_a_clear_error(ranks, tmp_path):
    result = launch(ranks, ["--nproc-per-node", "2", str(tmp_path / "no_such_script.py")])
    assert result.returncode == 2
    assert "no_such_script.py: no such script or command" in result.stderr


# ------------------------------------------------------------------------------------- multi-node


def test_node_0_prints_the_command_for_the_other_nodes_and_it_works(ranks, tmp_path):
    s = script(tmp_path, "env.py", ENV_DUMP)
    port = free_port()
    common = ["--nproc-per-node", "2", "--nnodes", "2", "--master-port", str(port)]
    node0 = launch(ranks, [*common, "--node-rank", "0", str(s), str(tmp_path / "a")])
    assert node0.returncode == 0, node0.stderr
    assert "cannot reach it" in node0.stderr  # 127.0.0.1 with two nodes
    printed = re.search(r"^\[launch\] on node 1 run: CYXWIZ_SECRET=([0-9a-f]{64}) (python -m pycyxwiz\.launch .*)$",
                        node0.stderr, re.M)
    assert printed, node0.stderr
    envs = read_envs(tmp_path / "a")
    job_id = envs[0]["CYXWIZ_JOB_ID"]
    assert printed.group(2) == (f"python -m pycyxwiz.launch --nproc-per-node 2 --nnodes 2 --node-rank 1 "
                                f"--master-addr 127.0.0.1 --master-port {port} --job-id {job_id} "
                                f"{shlex.quote(str(s))} {shlex.quote(str(tmp_path / 'a'))}")
    secret = printed.group(1)  # node 0 made the job's secret and gave it to its ranks

    words = shlex.split(printed.group(2))
    # The printed command, as typed on node 1.
    node1 = launch(ranks, words[1:], env=clean_env(CYXWIZ_SECRET=secret), command=[sys.executable])
    assert node1.returncode == 0, node1.stderr
    envs = read_envs(tmp_path / "a")
    assert set(envs) == {0, 1, 2, 3}
    assert {e["CYXWIZ_JOB_ID"] for e in envs.values()} == {job_id}
    assert {e["CYXWIZ_SECRET"] for e in envs.values()} == {secret}
    for rank, e in envs.items():
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["LOCAL_RANK"]) == ("4", "2", str(rank % 2))
        assert e["NODE_RANK"] == e["GROUP_RANK"] == str(rank // 2)

    # Typed by hand without --job-id, node 1 still agrees with node 0.
    typed = launch(ranks, [*common, "--node-rank", "1", str(s), str(tmp_path / "b")])
    assert typed.returncode == 0, typed.stderr
    assert {e["CYXWIZ_JOB_ID"] for e in read_envs(tmp_path / "b").values()} == {job_id}


def test_node_rank_must_be_below_nnodes(ranks, tmp_path):
    s = script(tmp_path, "env.py", ENV_DUMP)
    result = launch(ranks, ["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2", str(s), "x"])
    assert result.returncode == 2
    assert "--node-rank must be in [0, 2)" in result.stderr


# -------------------------------------------------------------------------------------------- ports


def test_busy_default_port_is_replaced_by_a_free_one(ranks, tmp_path):
    holder = socket.socket()
    try:
        holder.bind(("0.0.0.0", 29500))
        holder.listen()
    except OSError as e:
        holder.close()
        pytest.skip(f"cannot hold the default port 29500 busy for this test ({e}); something else has it")
    with holder:
        s = script(tmp_path, "env.py", ENV_DUMP)
        result = launch(ranks, ["--nproc-per-node", "1", str(s), str(tmp_path / "a")])
    assert result.returncode == 0, result.stderr
    port = read_envs(tmp_path / "a")[0]["MASTER_PORT"]
    assert port != "29500"
    assert f"port 29500 is in use; using free port {port} instead" in result.stderr


@pytest.mark.parametrize("value, problem", [("80x", "is not an integer"), ("70000", "is out of range")])
def test_bad_master_port_variable_is_worded_as_init_words_it(ranks, tmp_path, value, problem):
    s = script(tmp_path, "env.py", ENV_DUMP)
    result = launch(ranks, ["--nproc-per-node", "1", str(s), str(tmp_path / "a")], clean_env(MASTER_PORT=value))
    assert result.returncode == 1
    assert f"[launch] error: MASTER_PORT='{value}' {problem}: expected a TCP port, 1..65535" in result.stderr, \
        result.stderr
    assert not (tmp_path / "a").exists()


def test_busy_explicit_port_fails_before_any_rank_starts(ranks, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        s = script(tmp_path, "env.py", ENV_DUMP)
        result = launch(ranks, ["--nproc-per-node", "2", "--master-port", str(port), str(s), str(tmp_path / "a")])
    assert result.returncode == 1
    assert f"master port {port} is already in use" in result.stderr and "--master-port" in result.stderr
    assert not (tmp_path / "a").exists()


# -------------------------------------------------------------------------- launch_distributed.sh/.bat


@posix_only
@pytest.mark.parametrize("args", [[], ["2"], ["0", "python"], ["x", "python"], ["-1", "python"]])
def test_shell_launcher_usage_errors(ranks, tmp_path, args):
    result = launch(ranks, args, command=[str(ROOT / "launch_distributed.sh")])
    assert result.returncode == 2
    assert "usage: " in result.stderr


@posix_only
def test_shell_launcher_runs_the_command_on_n_ranks(ranks, tmp_path):
    s = script(tmp_path, "env.py", ENV_DUMP)
    env = clean_env(PYTHON=sys.executable, LAUNCH_ARGS=f"--master-port {free_port()}")
    result = launch(ranks, ["2", sys.executable, str(s), str(tmp_path / "a")], env,
                    command=[str(ROOT / "launch_distributed.sh")])
    assert result.returncode == 0, result.stderr
    assert set(read_envs(tmp_path / "a")) == {0, 1}


def test_batch_launcher_has_crlf_line_endings():
    data = (ROOT / "launch_distributed.bat").read_bytes()
    assert b"pycyxwiz.launch" in data
    assert data.count(b"\n") == data.count(b"\r\n") > 0


# --------------------------------------------------------------- cx.distributed.spawn, the same rules

SPAWNED = """\
import os, subprocess, sys, time
from pathlib import Path
import pycyxwiz as cx


def rank(local_rank, here, mode):
    here = Path(here)
    (here / f"rank.{local_rank}").write_text(str(os.getpid()))
    child = subprocess.Popen(["sleep", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (here / f"child.{local_rank}").write_text(str(child.pid))
    if mode == "sleep":
        (here / f"ready.{local_rank}").touch()
        time.sleep(600)
    return local_rank


if __name__ == "__main__":
    print(cx.distributed.spawn(rank, args=(os.getcwd(), sys.argv[1]), nprocs=2, timeout=60))
"""


def spawn_job(ranks, mode: str) -> subprocess.Popen:
    (ranks.tmp_path / "job.py").write_text(SPAWNED)
    return ranks.popen([sys.executable, "job.py", mode], clean_env(CYXWIZ_NUM_THREADS="1"), text=False)


def spawned_pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text()) for p in [*tmp_path.glob("rank.*"), *tmp_path.glob("child.*")] if p.read_text()]


def kill_spawned(ranks, proc: subprocess.Popen) -> None:
    kill_group(proc.pid)
    kill_pids(spawned_pids(ranks.tmp_path), ranks.tmp_path)
    proc.communicate(timeout=10)


def wait_gone(pids: list[int], tmp_path: Path, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(pid, tmp_path) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid, tmp_path)]


@posix_only
def test_spawn_stops_the_children_of_ranks_that_returned(ranks, tmp_path):
    proc = spawn_job(ranks, "return")
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0 and out.strip() == b"[0, 1]", err.decode()
        pids = spawned_pids(tmp_path)
        assert len(pids) == 4, err.decode()
        left = wait_gone(pids, tmp_path, 2)
        assert not left, f"processes of spawn's ranks (pids {left}) outlived spawn(); stderr:\n{err.decode()}"
    finally:
        kill_spawned(ranks, proc)


@posix_only
def test_spawned_ranks_end_when_their_parent_is_killed(ranks, tmp_path):
    proc = spawn_job(ranks, "sleep")
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
            time.sleep(0.02)
        pids = spawned_pids(tmp_path)
        assert len(pids) == 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        left = wait_gone(pids, tmp_path, 3)
        assert not left, f"spawn's ranks and their children (pids {left}) outlived the SIGKILLed parent by 3 s"
    finally:
        kill_spawned(ranks, proc)
