"""cx.distributed.init() under real third-party launchers, with no extra flags in the script:
torchrun (static rendezvous, --standalone, python -m torch.distributed.run), Open MPI's mpirun, and
pycyxwiz's own python -m pycyxwiz.launch.

Each test writes a rank script into tmp_path that records its pid (so that whatever a launcher
leaves behind is killed), joins the job, runs collectives on rank-dependent data and prints one
"CXRESULT {json}" line. A launcher missing from this machine skips its test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import free_port, kill_group, kill_recorded, rank_env

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the launchers are tested on POSIX (process groups)")

TIMEOUT = 90  # a whole launch: start-up of torch's agent is slow on a loaded 2-core machine

RANK_SCRIPT = r'''
import json, os, sys
from pathlib import Path
(Path(__file__).resolve().parent / "pids").mkdir(exist_ok=True)
(Path(__file__).resolve().parent / "pids" / str(os.getpid())).write_text("")
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
r, n = D.get_rank(), D.get_world_size()
a = np.arange(6, dtype=np.float64) + 10 * r
D.all_reduce(a)
gathered = [int(x[0]) for x in D.all_gather(np.array([r * r], np.int64))]
b = np.full(3, float(r), np.float32)
D.broadcast(b, src=n - 1)
c = D.get_config()
record = json.dumps(dict(
    rank=r, world=n, local=D.get_local_rank(), source=c.source, job_id=c.job_id, sum=a.tolist(),
    gathered=gathered, bcast=b.tolist(), cfg_rank=c.rank, cfg_world=c.world_size,
    env={k: os.environ.get(k) for k in ("TORCHELASTIC_RUN_ID", "CYXWIZ_JOB_ID", "OMPI_COMM_WORLD_RANK",
                                         "OMPI_MCA_ess_base_jobid", "LOCAL_RANK", "RANK")}))
# stdout for the launcher's forwarding; a file as well, because mpirun may glue lines of ranks together
(Path(__file__).resolve().parent / "results").mkdir(exist_ok=True)
(Path(__file__).resolve().parent / "results" / f"{r}.json").write_text(record)
print("CXRESULT " + record, flush=True)
D.finalize()
'''

def launch(ranks, cmd: list[str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """Runs a launcher in its own session (no launcher's variables inherited, one thread per rank, a 30 s
    collective timeout); kills it, its group and every rank that recorded its pid."""
    ranks.script(RANK_SCRIPT)
    p = ranks.popen(cmd, rank_env(OMP_NUM_THREADS="1", DISTRIBUTED_TIMEOUT_MS="30000"))
    try:
        r = ranks.finish(p, timeout)  # fails the test, with the output, at the deadline
        return r.rc, r.out, r.err
    finally:
        kill_group(p.pid)  # the group may outlive its leader
        kill_recorded(ranks.tmp_path / "pids", ranks.tmp_path)


def results(tmp_path: Path, report: str) -> dict[int, dict]:
    """The record each rank wrote, by rank."""
    files = sorted((tmp_path / "results").glob("*.json")) if (tmp_path / "results").is_dir() else []
    recs = {int(f.stem): json.loads(f.read_text()) for f in files}
    for r, rec in recs.items():
        assert rec["rank"] == r, report
    return recs


def stdout_records(out: str) -> list[dict]:
    """CXRESULT records in the launcher's stdout, wherever they sit in a line."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(out, m.end())[0] for m in re.finditer(r"CXRESULT ", out)]


def check_collectives(recs: dict[int, dict], world: int, report: str) -> None:
    assert sorted(recs) == list(range(world)), report
    expected_sum = [world * i + 10 * world * (world - 1) / 2 for i in range(6)]
    for r, rec in recs.items():
        assert rec["world"] == world and rec["cfg_world"] == world and rec["cfg_rank"] == r, report
        assert rec["sum"] == expected_sum, report
        assert rec["gathered"] == [k * k for k in range(world)], report
        assert rec["bcast"] == [float(world - 1)] * 3, report
    assert len({rec["job_id"] for rec in recs.values()}) == 1, f"the ranks disagree on the job id:\n{report}"


def fmt(rc: int, out: str, err: str) -> str:
    return f"rc={rc}\n--- stdout\n{out}\n--- stderr\n{err}"


# ------------------------------------------------------------------------------------------ torchrun

needs_torchrun = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed (pip install torch)")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@pytest.mark.parametrize("how", [
    pytest.param("torchrun", marks=needs_torchrun),
    pytest.param("torchrun --standalone", marks=needs_torchrun),
    pytest.param("python -m torch.distributed.run", marks=needs_torch),
])
def test_torchrun(ranks, tmp_path, how):
    if how == "torchrun":
        cmd = ["torchrun", "--nproc-per-node", "2", "--master-port", str(free_port())]
    elif how == "torchrun --standalone":
        cmd = ["torchrun", "--standalone", "--nproc-per-node", "2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port())]
    rc, out, err = launch(ranks, cmd + ["rank_script.py"])
    report = fmt(rc, out, err)
    assert rc == 0, report
    recs = results(tmp_path, report)
    check_collectives(recs, 2, report)
    assert sorted(rec["rank"] for rec in stdout_records(out)) == [0, 1], report
    for r, rec in recs.items():
        assert rec["local"] == r, report
        assert rec["source"] == "torchrun", report  # torchrun's agent store holds MASTER_PORT: we use the next
        run_id = rec["env"]["TORCHELASTIC_RUN_ID"]
        assert run_id, f"torchrun did not set TORCHELASTIC_RUN_ID:\n{report}"
        assert rec["job_id"] == run_id, report


@needs_torchrun
def test_torchrun_when_the_port_after_master_port_is_taken(ranks, tmp_path):
    """torchrun's agent holds MASTER_PORT; pycyxwiz's rendezvous moves on past a stranger on MASTER_PORT + 1."""
    port = free_port()
    with socket.socket() as stranger:
        try:
            stranger.bind(("0.0.0.0", port + 1))
        except OSError:
            pytest.skip(f"port {port + 1} is not free here")
        stranger.listen()
        rc, out, err = launch(ranks, ["torchrun", "--nproc-per-node", "2", "--master-port", str(port),
                                      "rank_script.py"])
    report = fmt(rc, out, err)
    assert rc == 0, report
    check_collectives(results(tmp_path, report), 2, report)


# -------------------------------------------------------------------------------------------- mpirun


def _open_mpi() -> str | None:
    """Why Open MPI's mpirun cannot be used here, or None."""
    exe = shutil.which("mpirun")
    if exe is None:
        return "mpirun is not installed (apt-get install openmpi-bin)"
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mpirun --version failed: {e}"
    if "Open MPI" not in version and "Open RTE" not in version:
        return f"mpirun is not Open MPI: {version.strip()[:80]!r}"
    return None


def test_mpirun_open_mpi(ranks, tmp_path):
    why = _open_mpi()
    if why:
        pytest.skip(why)
    port = free_port()
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", f"MASTER_PORT={port}",
           "-x", "CYXWIZ_NUM_THREADS", "-x", "DISTRIBUTED_TIMEOUT_MS", sys.executable, "rank_script.py"]
    rc, out, err = launch(ranks, cmd)
    report = fmt(rc, out, err)
    assert rc == 0, report
    recs = results(tmp_path, report)
    check_collectives(recs, 3, report)
    assert sorted(rec["rank"] for rec in stdout_records(out)) == [0, 1, 2], report  # mpirun forwarded the output
    for r, rec in recs.items():
        assert rec["source"] == "Open MPI", report
        assert rec["env"]["RANK"] is None and rec["env"]["OMPI_COMM_WORLD_RANK"] == str(r), report
        assert rec["local"] == r, report  # one node: the local rank is the rank
        assert rec["job_id"], f"no job id from Open MPI's environment:\n{report}"


# ------------------------------------------------------------------------------------ pycyxwiz.launch


def test_pycyxwiz_launch(ranks, tmp_path):
    if importlib.util.find_spec("pycyxwiz.launch") is None:
        pytest.fail("python -m pycyxwiz.launch: the module pycyxwiz.launch is not installed")
    port = free_port()
    cmd = [sys.executable, "-m", "pycyxwiz.launch", "--nproc-per-node", "2", "--master-port", str(port),
           "rank_script.py"]
    rc, out, err = launch(ranks, cmd)
    report = fmt(rc, out, err)
    assert rc == 0, report
    recs = results(tmp_path, report)
    check_collectives(recs, 2, report)
    for r, rec in recs.items():
        assert rec["local"] == r and rec["source"] == "RANK/WORLD_SIZE", report
        assert rec["env"]["CYXWIZ_JOB_ID"] and rec["job_id"] == rec["env"]["CYXWIZ_JOB_ID"], report
    # Each rank's output line is forwarded whole, with its rank in front.
    for r in range(2):
        assert re.search(rf"^\[rank {r}\] CXRESULT \{{", out, re.M), report
