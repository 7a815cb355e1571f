"""The shared-memory transport: when it is chosen, what CYXWIZ_TRANSPORT does, and that its segment
lives in /dev/shm only while the ranks attach.

The collectives over it are checked against numpy by test_collectives.py and test_collective_dtypes.py
(both transports), its failures (a peer killed, stopped, finalized, Ctrl-C, a mismatch) by
test_failures.py, which runs on it by default and again over TCP in .ci/run.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys

import pytest
from harness import shm_segments

import pycyxwiz as cx

INIT_AND_REPORT = r'''
import json, os, sys, time
import numpy as np
import pycyxwiz as cx
d = cx.distributed
try:
    d.init()
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "msg": str(e)}))
    sys.exit(3)
x = np.full(100000, d.get_rank() + 1, np.float32)
d.all_reduce(x)
maps = open("/proc/self/maps").read()
mapped = sorted({line.split()[-2] if line.endswith("(deleted)") else line.split()[-1]
                 for line in maps.splitlines() if "/dev/shm/cyxwiz" in line})
print(json.dumps({"transport": d.get_config().transport, "sum": float(x[0]), "mapped": mapped,
                  "deleted": all(line.endswith("(deleted)") for line in maps.splitlines() if "/dev/shm/cyxwiz" in line),
                  "in_dev_shm": sorted(n for n in os.listdir("/dev/shm") if n.startswith("cyxwiz"))}), flush=True)
if os.environ.get("HOLD"):
    while not os.path.exists(os.environ["HOLD"]):
        time.sleep(0.05)
d.finalize()
'''


def _line_within(p: subprocess.Popen, seconds: float) -> str:
    ready, _, _ = select.select([p.stdout], [], [], seconds)
    assert ready, f"rank {p.rank} printed nothing within {seconds} s"
    line = p.stdout.readline()
    assert line, f"rank {p.rank} exited: {p.wait(5)} {p.stderr.read()}"
    return line


def reports(ranks, results):
    assert all(r.out.strip() for r in results), ranks.report(results)
    return [json.loads(r.out.strip().splitlines()[-1]) for r in results]


@pytest.mark.parametrize("setting, expected", [(None, "shm"), ("auto", "shm"), ("shm", "shm"), ("tcp", "tcp"), ("", "shm")])
def test_one_host_takes_shared_memory_unless_told(ranks, setting, expected):
    env = {} if setting is None else {"CYXWIZ_TRANSPORT": setting}
    results = ranks.run(INIT_AND_REPORT, 3, env=env)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    for rep in reports(ranks, results):
        assert rep["transport"] == expected and rep["sum"] == 6.0, rep
        # Mapped while in use, but no longer in /dev/shm: rank 0 unlinked it once every rank attached.
        assert rep["in_dev_shm"] == [] and rep["deleted"], rep
        assert len(rep["mapped"]) == (1 if expected == "shm" else 0), rep


def test_segment_is_gone_from_dev_shm_while_the_ranks_run_and_after_sigkill(ranks, tmp_path):
    hold = tmp_path / "release"
    before = shm_segments()
    procs = ranks.start(INIT_AND_REPORT, 2, env={"HOLD": str(hold)})
    lines = [json.loads(_line_within(p, 60)) for p in procs]  # after init and an all-reduce; then they hold
    assert all(rep["transport"] == "shm" for rep in lines), lines
    assert shm_segments() - before == set(), "a segment is still linked while the ranks run"
    for p in procs:
        p.kill()
    ranks.wait(procs, timeout=20)
    assert shm_segments() - before == set()


def test_transport_values_are_checked(monkeypatch):
    monkeypatch.setenv("CYXWIZ_TRANSPORT", "infiniband")
    with pytest.raises(ValueError, match=r"CYXWIZ_TRANSPORT='infiniband' is not a transport: expected auto .*tcp or shm"):
        cx.distributed.DistributedConfig.from_environment()
    monkeypatch.delenv("CYXWIZ_TRANSPORT")
    c = cx.distributed.DistributedConfig()
    assert c.transport == "auto"
    c.transport = "udp"
    with pytest.raises(ValueError, match=r"DistributedConfig.transport='udp' is not a transport"):
        cx.distributed.init(c)


def test_shm_algorithm_values_are_checked(monkeypatch):
    monkeypatch.setenv("CYXWIZ_SHM_ALGORITHM", "tree")
    with pytest.raises(ValueError, match=r"CYXWIZ_SHM_ALGORITHM='tree' is not an algorithm: expected direct .* or ring"):
        cx.distributed.DistributedConfig.from_environment()


def test_ranks_that_disagree_on_the_shm_algorithm_all_say_so(ranks):
    results = ranks.run(INIT_AND_REPORT, 2, rank_env={1: {"CYXWIZ_SHM_ALGORITHM": "ring"}}, timeout=60)
    for r, rep in zip(results, reports(ranks, results)):
        assert r.rc == 3 and rep["error"] == "ValueError", ranks.report(results)
        assert "CYXWIZ_SHM_ALGORITHM differs between ranks" in rep["msg"] and "'direct'" in rep["msg"], rep
        assert "'ring'" in rep["msg"] and rep["msg"].startswith(f"[rank {r.rank}/2] init: "), rep


def test_ranks_that_disagree_on_the_transport_all_say_so(ranks):
    results = ranks.run(INIT_AND_REPORT, 2, rank_env={1: {"CYXWIZ_TRANSPORT": "tcp"}}, timeout=60)
    for r, rep in zip(results, reports(ranks, results)):
        assert r.rc == 3 and rep["error"] == "ValueError", ranks.report(results)
        assert "CYXWIZ_TRANSPORT differs between ranks" in rep["msg"] and "'auto'" in rep["msg"] and "'tcp'" in rep["msg"], rep
        assert rep["msg"].startswith(f"[rank {r.rank}/2] init: "), rep


def _private_dev_shm_command(python_args: list[str]) -> list[str]:
    """A rank in its own IPC and mount namespace with its own tmpfs on /dev/shm: another host, as far
    as shared memory goes (the recipe of ../shared/tools/simhosts.sh, without the network part)."""
    script = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"'
    return ["unshare", "--ipc", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *python_args]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(_private_dev_shm_command(["true"]), capture_output=True, timeout=20)
    return probe.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces are Linux only")
@pytest.mark.parametrize("setting", ["auto", "shm"])
def test_a_rank_that_cannot_share_memory_means_tcp_or_a_clear_error(ranks, setting):
    if not _can_unshare():
        pytest.skip("needs root and unshare(1) to give a rank its own IPC namespace and /dev/shm")
    path = ranks.script(INIT_AND_REPORT)
    procs = [ranks.popen([sys.executable, str(path)], ranks.env(0, 2, {"CYXWIZ_TRANSPORT": setting}), rank=0),
             ranks.popen(_private_dev_shm_command([sys.executable, str(path)]),
                         ranks.env(1, 2, {"CYXWIZ_TRANSPORT": setting}), rank=1)]
    results = ranks.wait(procs, timeout=60)
    reps = reports(ranks, results)
    if setting == "auto":
        assert all(r.rc == 0 for r in results), ranks.report(results)
        assert [rep["transport"] for rep in reps] == ["tcp", "tcp"] and all(rep["sum"] == 3.0 for rep in reps), reps
    else:
        for r, rep in zip(results, reps):
            assert r.rc == 3 and rep["error"] == "ValueError", ranks.report(results)
            assert "CYXWIZ_TRANSPORT=shm, but rank 1 is on another host than rank 0" in rep["msg"], rep
            assert rep["msg"].startswith(f"[rank {r.rank}/2] init: "), rep
            assert "unset CYXWIZ_TRANSPORT (auto) or set it to tcp" in rep["msg"], rep


# ------------------------------------------------------------------ shared buffers (DDP's buckets)

SHARED = r'''
import json, os, sys
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
R, W = D.get_rank(), D.get_world_size()
checks = 0

def expect(ok, what):
    global checks
    if not ok:
        print(json.dumps({"failed": what}), flush=True)
        sys.exit(4)
    checks += 1

def mapped():
    # A peer unlinks its segment a moment after this rank returns: count names, deleted or not.
    lines = open("/proc/self/maps").read().splitlines()
    return {line.split()[5] for line in lines if "/dev/shm/cyxwiz" in line}

base = len(mapped())
OPS = {"SUM": D.ReduceOp.SUM, "MAX": D.ReduceOp.MAX, "AVG": D.ReduceOp.AVG}
for dtype in (np.float32, np.float64, np.int64):
    for n in (9000, 65537, (1 << 20) + 3):
        for name, op in OPS.items():
            if name == "AVG" and dtype == np.int64:
                continue
            mine = [(np.random.default_rng(1000 * r + n).standard_normal(n) * 100).astype(dtype) for r in range(W)]
            s = D._shared_zeros(mine[R])
            expect(s.dtype == dtype and s.shape == (n,) and not s.any(), "a shared buffer starts as zeros")
            expect(len(mapped()) == base + W, f"{W} more segments mapped, {len(mapped()) - base} seen")
            p = mine[R].copy()
            for round in range(3):  # the same buffer again and again, as DDP does
                s[:] = mine[R] + round
                p[:] = mine[R] + round
                D.all_reduce(s, op=op)
                D.all_reduce(p, op=op)
                # The same bits as through the slots; numpy (in float64) as the oracle.
                expect(np.array_equal(s, p), f"{dtype.__name__} {n} {name}: shared and private differ")
                stack = np.stack([m + round for m in mine]).astype(np.float64)
                want = {"SUM": stack.sum(0), "MAX": stack.max(0), "AVG": stack.mean(0)}[name]
                tol = 1e-3 if dtype == np.float32 else 1e-9
                expect(np.allclose(s.astype(np.float64), want, rtol=tol, atol=tol), f"{dtype.__name__} {n} {name}: wrong sum")
            del s
gone = len(mapped()) == base
# DDP's buckets are shared buffers: one segment per rank per bucket.
model = cx.SequentialModel()
model.add(cx.LinearModule(784, 256)); model.add(cx.ReLUModule()); model.add(cx.LinearModule(256, 10))
ddp = D.DistributedDataParallel(model)
D.barrier()  # every rank has unlinked its segments (right after the others mapped them)
print(json.dumps({"checks": checks, "released": gone, "ddp_segments": len(mapped()) - base,
                  "in_dev_shm": sorted(f for f in os.listdir("/dev/shm") if f.startswith("cyxwiz"))}), flush=True)
D.finalize()
'''


@pytest.mark.parametrize("world", [2, 3])
def test_shared_buffers_reduce_where_they_lie(ranks, world):
    results = ranks.run(SHARED, world, timeout=240)
    for rep in reports(ranks, results):
        assert "failed" not in rep, rep
        assert rep["checks"] >= 8 * 2 * 3 * 3, rep
        assert rep["released"], "the segments of dropped shared buffers are still mapped"
        assert rep["ddp_segments"] >= world and rep["ddp_segments"] % world == 0, rep
        assert rep["in_dev_shm"] == [], rep


SHARED_MISMATCH = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
s = D._shared_zeros(np.zeros(100000, np.float32))
x = s if D.get_rank() == 0 else np.zeros(100000, np.float32)
try:
    D.all_reduce(x)
    print(json.dumps({"error": None}))
except D.DistError as e:
    print(json.dumps({"error": type(e).__name__, "msg": str(e)}))
'''


def test_a_shared_buffer_on_one_rank_and_private_memory_on_another_is_a_mismatch(ranks):
    results = ranks.run(SHARED_MISMATCH, 2, timeout=60)
    reps = reports(ranks, results)
    for rep in reps:
        assert rep["error"] == "DistBackendError", rep
    assert any("mismatch" in rep["msg"] and "shared buffer 1" in rep["msg"] for rep in reps), reps


FULL_DEV_SHM = r'''
import json, os
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
x = D._shared_zeros(np.zeros(3 << 20, np.float32))  # 12 MiB a rank: two do not fit a 16 MiB /dev/shm
x[:] = D.get_rank() + 1
D.all_reduce(x)
report = {"rank": D.get_rank(), "sum_ok": bool((x == 3).all()), "transport": D.get_config().transport,
          "in_dev_shm": sorted(f for f in os.listdir("/dev/shm") if f.startswith("cyxwiz"))}
with open(f"report_{D.get_rank()}.json", "w") as f:  # both ranks share one stdout here
    json.dump(report, f)
D.finalize()
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces are Linux only")
def test_shared_buffers_fall_back_to_private_memory_when_dev_shm_is_full(ranks):
    if not _can_unshare():
        pytest.skip("needs root and unshare(1) to give the ranks their own, small /dev/shm")
    path = ranks.script(FULL_DEV_SHM)
    # Both ranks on one host whose /dev/shm holds 16 MiB (a container's is often 64 MiB).
    script = 'mount -t tmpfs -o size=16m tmpfs /dev/shm && { RANK=1 "$0" "$1" & "$0" "$1"; wait; }'
    cmd = ["unshare", "--ipc", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, str(path)]
    [result] = ranks.wait([ranks.popen(cmd, ranks.env(0, 2, {"CYXWIZ_LOG_LEVEL": "info"}), rank=0)], timeout=60)
    assert result.rc == 0, ranks.report([result])
    reps = [json.loads((ranks.tmp_path / f"report_{r}.json").read_text()) for r in (0, 1)]
    assert [rep["rank"] for rep in reps] == [0, 1], ranks.report([result])
    for rep in reps:
        assert rep["sum_ok"] and rep["transport"] == "shm" and rep["in_dev_shm"] == [], rep
    assert "stays in private memory" in result.err and "cannot reserve" in result.err, result.err
