"""cx.distributed.spawn: ranks started from Python (as torch.multiprocessing.spawn), each a fresh
interpreter. Each test runs a real script in its own session under a hard timeout; the test checks
that every rank process is gone afterwards, whatever happened."""

from __future__ import annotations

import json
import sys

import pytest
from harness import alive, clean_env, kill_group

import pycyxwiz as cx

SCRIPT = r'''
import json, os, sys, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed


def summed(local_rank, scale):
    D.init()
    a = np.full(4, float(D.get_rank() + 1) * scale, np.float32)
    D.all_reduce(a)
    out = {"rank": D.get_rank(), "local_rank": local_rank, "world": D.get_world_size(), "sum": a.tolist(),
           "pid": os.getpid()}
    D.finalize()
    return out


def raises(local_rank):
    D.init()
    with open(f"pid.{local_rank}", "w") as f:
        f.write(str(os.getpid()))
    if local_rank == 1:
        raise RuntimeError("boom on purpose")
    D.barrier()
    time.sleep(120)


def exits(local_rank):
    with open(f"pid.{local_rank}", "w") as f:
        f.write(str(os.getpid()))
    if local_rank == 0:
        os._exit(7)
    time.sleep(120)


def sleeps(local_rank):
    with open(f"pid.{local_rank}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


if __name__ == "__main__":
    case = sys.argv[1]
    t0 = time.monotonic()
    try:
        if case == "ok":
            result = D.spawn(summed, args=(2.0,), nprocs=3)
        elif case == "raises":
            result = D.spawn(raises, nprocs=2)
        elif case == "exits":
            result = D.spawn(exits, nprocs=2)
        else:
            result = D.spawn(sleeps, nprocs=2, timeout=3)
        print("RESULT " + json.dumps({"ok": True, "result": result}))
    except D.SpawnError as e:
        print("RESULT " + json.dumps({"ok": False, "rank": e.rank, "exit_code": e.exit_code, "msg": str(e),
                                      "elapsed": time.monotonic() - t0}))
'''


def run_case(ranks, case: str, timeout: float = 60) -> dict:
    script = ranks.script(SCRIPT, "job.py")
    p = ranks.popen([sys.executable, script, case], clean_env(CYXWIZ_NUM_THREADS="1"))
    try:
        r = ranks.finish(p, timeout)
    finally:
        kill_group(p.pid)  # the ranks are in the same session: none survives the test
    lines = [line for line in r.out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"rc={r.rc}\n{r.out}\n{r.err}"
    return json.loads(lines[-1][len("RESULT "):])


def rank_pids(tmp_path) -> list[int]:
    return [int(f.read_text()) for f in sorted(tmp_path.glob("pid.*"))]


def test_spawn_runs_the_ranks_and_returns_their_values(ranks, tmp_path):
    rep = run_case(ranks, "ok")
    assert rep["ok"], rep
    result = rep["result"]
    assert [r["rank"] for r in result] == [0, 1, 2] and [r["local_rank"] for r in result] == [0, 1, 2]
    assert all(r["world"] == 3 for r in result)
    assert all(r["sum"] == [2.0 * (1 + 2 + 3)] * 4 for r in result), result  # numpy oracle: sum of (rank+1)*2
    assert len({r["pid"] for r in result}) == 3, "the ranks must be separate processes"
    assert not any(alive(r["pid"], tmp_path) for r in result)


def test_a_rank_that_raises_stops_the_others_with_its_traceback(ranks, tmp_path):
    rep = run_case(ranks, "raises")
    assert not rep["ok"] and rep["rank"] == 1, rep
    assert "boom on purpose" in rep["msg"] and "Traceback" in rep["msg"], rep["msg"]
    assert rep["elapsed"] < 30, rep
    pids = rank_pids(tmp_path)
    assert len(pids) == 2 and not any(alive(p, tmp_path) for p in pids), pids


def test_a_rank_that_exits_is_reported_with_its_exit_code(ranks, tmp_path):
    rep = run_case(ranks, "exits")
    assert not rep["ok"] and rep["rank"] == 0 and rep["exit_code"] == 7, rep
    assert "exited with code 7" in rep["msg"], rep["msg"]
    assert not any(alive(p, tmp_path) for p in rank_pids(tmp_path))


def test_timeout_stops_every_rank(ranks, tmp_path):
    rep = run_case(ranks, "timeout")
    assert not rep["ok"] and rep["rank"] is None, rep
    assert "timeout of 3" in rep["msg"], rep["msg"]
    assert 3 <= rep["elapsed"] < 15, rep
    assert not any(alive(p, tmp_path) for p in rank_pids(tmp_path))


@pytest.mark.parametrize("kw", [{"nprocs": 0}, {"nprocs": 2, "nnodes": 2, "node_rank": 2},
                                {"nprocs": 2, "nnodes": 2, "node_rank": 1}])
def test_bad_arguments_are_value_errors(kw, monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="spawn"):
        cx.distributed.spawn(print, **kw)
