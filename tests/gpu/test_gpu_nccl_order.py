"""The NCCL backend with CUDA graphs and several ranks (issue 14 items 2, 6, 7 and 8), under the
host emulator with two emulated GPUs (CYXWIZ_EMULATED_GPUS=2), which models what these need: NCCL
>= 2.26's finalize that waits for every graph holding one of the communicator's collectives, two
collectives of one communicator running at once (counted, and the communicator fails), a capture
refused on one rank only (CYXWIZ_EMULATED_CAPTURE_FAIL=1 set in that rank), and GPUs told apart by
UUID (CYXWIZ_EMULATED_HOST_ID names the emulated machine).

Between real processes on 127.0.0.1 with tests/distributed's harness (a free port per test, a hard
timeout, every process killed at the end)."""

from __future__ import annotations

import os

import pytest
from gpu_support import DDP_PRELUDE, assert_same_digest, ddp_reports, requires_two_gpus

EMULATED = os.environ.get("CYXWIZ_CUDA_LIBRARY", "").endswith("libcyxwiz_cuda_emulated.so")
pytestmark = [requires_two_gpus, pytest.mark.skipif(not EMULATED, reason="needs the host emulator's NCCL model")]

NCCL = {"DISTRIBUTED_BACKEND": "nccl", "DISTRIBUTED_TIMEOUT_MS": "20000", "CYXWIZ_LOG_LEVEL": "info"}

GRAPHED = DDP_PRELUDE + r'''
import ctypes
emu = ctypes.CDLL(os.environ["CYXWIZ_CUDA_LIBRARY"])
if RANK == 1 and os.environ.get("TEST_REFUSE_ON_RANK1") == "1":
    os.environ["CYXWIZ_EMULATED_CAPTURE_FAIL"] = "1"   # read at each capture: this rank's runtime refuses it
D.init()
rng = np.random.RandomState(3)
X = rng.standard_normal((16 * 8, 20)).astype(np.float32)
y = rng.randint(0, 5, len(X)).astype(np.int64)
cx.manual_seed(1)
model = build(seed=1)
model.to(f"cuda:{D.get_local_rank()}")
ddp = D.DistributedDataParallel(model)
step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01), cuda_graphs=True)
pending = os.environ.get("TEST_PENDING_COLLECTIVE") == "1"
side = cx.Tensor(np.full(1 << 16, RANK + 1.0, np.float32)).to(f"cuda:{D.get_local_rank()}")
for i in range(0, len(X), 16):
    if pending and i >= 32:
        w = D.all_reduce(side, async_op=True)   # still in flight when the replay is launched
    step(X[i:i + 16], y[i:i + 16])
    if pending and i >= 32:
        w.wait()
out = dict(graphed=step.graphed, replays=step.replays, misuse=emu.cxemu_test_nccl_misuse(),
           params=[p.tolist() for p in model.parameters()])
if pending:
    expected = float(sum(range(1, WS + 1)) * WS ** 5)   # 6 all-reduces of (rank + 1), in place
    close("the side all-reduce", side.numpy()[:4], [expected] * 4, rtol=1e-6)
t0 = time.monotonic()
D.finalize()                 # the step, and its graph, still alive
out["finalize_seconds"] = time.monotonic() - t0
finish(digest=digest([np.asarray(p, np.float32) for p in out.pop("params")]), **out)
'''


def test_finalize_with_a_graphed_step_alive_returns(ranks):
    """Item 2: NCCL's finalize waits for the graphs holding its collectives; the backend drops them
    first, so finalize returns at once instead of hanging (a 10 s finalize, then an abort that waits
    for the finalize)."""
    results = ranks.run(GRAPHED, 2, env=NCCL, timeout=90)
    reports = ddp_reports(ranks, results, 2)
    assert_same_digest(reports)
    for r in reports:
        assert r["graphed"] and r["replays"] == 7, r
        assert r["finalize_seconds"] < 5, r


def test_a_replay_waits_for_a_pending_async_collective(ranks):
    """Item 6: a user's async all-reduce still in flight on the communication stream when the graphed
    step is replayed: the replay's gradient all-reduce (on the compute stream's graph) must come after
    it, never beside it on the same communicator."""
    results = ranks.run(GRAPHED, 2, env={**NCCL, "TEST_PENDING_COLLECTIVE": "1"}, timeout=90)
    reports = ddp_reports(ranks, results, 2)
    assert_same_digest(reports)
    for r in reports:
        assert r["misuse"] == 0, f"two collectives of one communicator ran at once on rank {r['rank']}"
        assert r["graphed"] and r["replays"] == 7, r


def test_a_capture_refused_on_one_rank_makes_every_rank_step_eagerly(ranks):
    """Item 7: rank 1's runtime refuses the capture; rank 0's succeeds. Both must fall back together
    (a rank replaying beside one stepping eagerly pairs different collectives) and end identical."""
    results = ranks.run(GRAPHED, 2, env={**NCCL, "TEST_REFUSE_ON_RANK1": "1"}, timeout=90)
    reports = ddp_reports(ranks, results, 2)
    assert_same_digest(reports)
    for r, res in zip(reports, results):
        assert not r["graphed"] and r["replays"] == 0, r
        assert "training without graphs" in res.err, res.err[-2000:]
    assert "another rank's capture was refused" in results[0].err, results[0].err[-2000:]


SAME_GPU = DDP_PRELUDE + r'''
mode = os.environ["TEST_MODE"]
if mode == "containers":
    os.environ["CYXWIZ_EMULATED_HOST_ID"] = f"container-{RANK}"   # one machine each, one GPU each
if mode in ("uuid", "index") and RANK == 1:
    # cuda:0 named on rank 1 only, by UUID or by index (the emulator does not apply CUDA_VISIBLE_DEVICES:
    # both ranks see the same GPU, as a GPU's driver would for these spellings)
    os.environ["CUDA_VISIBLE_DEVICES"] = cx.cuda.get_device_properties(0)["uuid"] if mode == "uuid" else "0"
cls = message = ""
try:
    D.init()
    t = cx.Tensor(np.full(5, RANK + 1.0, np.float32)).to("cuda:0")
    D.all_reduce(t)
    expect(t.numpy().tolist() == [3.0] * 5, f"all_reduce gave {t.numpy().tolist()}")
    D.finalize()
except D.DistError as e:
    cls, message = type(e).__name__, str(e)
finish(cls=cls, message=message)
'''


@pytest.mark.parametrize("spelling", ["uuid", "index"])
def test_one_gpu_named_differently_on_two_ranks_is_refused(ranks, spelling):
    """Item 8: the same GPU under two spellings of CUDA_VISIBLE_DEVICES (unset on rank 0; its UUID, or
    "0", on rank 1) is still one GPU."""
    results = ranks.run(SAME_GPU, 2, env={**NCCL, "LOCAL_RANK": "0", "TEST_MODE": spelling}, timeout=60)
    for r in ddp_reports(ranks, results, 2):
        assert r["cls"] == "DistBackendError" and "both use" in r["message"] and "GPU-" in r["message"], r


def test_containers_sharing_a_hostname_with_a_gpu_each_are_accepted(ranks):
    """Item 8: two containers, one GPU each, the same hostname and LOCAL_RANK=0: different GPUs."""
    results = ranks.run(SAME_GPU, 2, env={**NCCL, "LOCAL_RANK": "0", "TEST_MODE": "containers"}, timeout=60)
    for r in ddp_reports(ranks, results, 2):
        assert r["cls"] == "" and r["errors"] == [], r
