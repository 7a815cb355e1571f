"""DDP's fused optimizer step (ddp.h, "Fused step"), with real processes on 127.0.0.1, one host.

Where nothing overlaps (CYXWIZ_DDP_OVERLAP=0), a bucket every rank maps that is larger than the shared
window's half is not all-reduced and then stepped on: the optimizer reads each piece of the average as it
is reduced from the ranks' buckets. Oracle: the same model and data through the unfused path
(CYXWIZ_DDP_FUSED_STEP=0) in the same processes; the parameters must be the same bits after every step,
on every rank, plain and sharded, SGD with momentum and Adam. The INFO line says which path each took.
"""

from __future__ import annotations

import pytest
from test_ddp import PRELUDE, assert_same_digest, reports_of

FUSED = PRELUDE + r'''
opt_kind, shard_opt = os.environ["TEST_OPT"], os.environ["TEST_SHARD"] == "1"
D.init()


def wrap(fused):
    # A 20 x 4096 first layer (320 KiB, a bucket of its own, larger than the window's half: fused) and
    # small buckets after it (through the all-reduce either way).
    os.environ["CYXWIZ_DDP_FUSED_STEP"] = "1" if fused else "0"
    cfg = D.DDPConfig()
    cfg.bucket_size_mb = 0.01
    cfg.shard_optimizer = shard_opt
    cfg.gradient_dtype = os.environ.get("TEST_WIRE", "float32")
    ddp = D.DistributedDataParallel(build(0, hidden=4096, extra=True), cfg)
    del os.environ["CYXWIZ_DDP_FUSED_STEP"]
    return ddp, make_opt(opt_kind)


(fused, fopt), (plain, popt) = wrap(True), wrap(False)
for step in range(4):
    X, y = batch(step, 8 * WS)
    xs, ys = shard(X, 8), shard(y, 8)
    for ddp, opt in ((fused, fopt), (plain, popt)):
        ddp.backward(LOSS.backward(ddp.forward(xs), ys))
        ddp.update_parameters(opt)
    got, want = flat(fused.parameters()), flat(plain.parameters())
    bad = int((got != want).sum())
    expect(bad == 0, f"step {step}: {bad} of {got.size} parameters differ between the fused and the unfused step")
    expect(not np.array_equal(got, flat(build(0, hidden=4096, extra=True).parameters())), "the step changed nothing")
    expect(all(not np.any(np.asarray(g)) for g in fused.gradients()), "the fused step left gradients behind")
finish(digest=digest(fused.parameters()))
'''


@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
@pytest.mark.parametrize("world,shard_opt", [(2, False), (2, True), (3, True)], ids=["2-plain", "2-sharded", "3-sharded"])
def test_the_fused_step_gives_the_all_reduce_steps_bits(ranks, opt_kind, world, shard_opt):
    env = {"TEST_OPT": opt_kind, "TEST_SHARD": "1" if shard_opt else "0", "CYXWIZ_TRANSPORT": "auto",
           "CYXWIZ_DDP_OVERLAP": "0", "CYXWIZ_LOG_LEVEL": "info"}
    results = ranks.run(FUSED, world, env=env, timeout=90)
    assert_same_digest(reports_of(ranks, results, world))
    for r in results:
        lines = [l for l in r.err.splitlines() if "gradient buckets" in l]
        assert len(lines) == 2, ranks.report(results)[-3000:]
        assert "the optimizer step reading 1 of them as they are reduced" in lines[0], lines
        assert "as they are reduced" not in lines[1], lines


@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
@pytest.mark.parametrize("world,shard_opt", [(2, True), (3, True), (2, False)], ids=["2-sharded", "3-sharded", "2-plain"])
def test_the_16_bit_exchange_on_one_host_takes_the_fused_step_with_its_bits(ranks, wire, world, shard_opt):
    """A bucket rounded as the peers' float32 buckets are read (one host, larger than the window's half)
    is fused as a float32 one is: the optimizer reads each piece of this rank's part of the rounded
    reduction (sharded), and in the plain step at two ranks also the peer's part where it lies once the peer
    has rounded it: the same bits as the rounded reduce-scatter / all-reduce (CYXWIZ_DDP_FUSED_STEP=0)
    leaves in the bucket."""
    env = {"TEST_OPT": "adam", "TEST_SHARD": "1" if shard_opt else "0", "TEST_WIRE": wire, "CYXWIZ_TRANSPORT": "auto",
           "CYXWIZ_DDP_OVERLAP": "0", "CYXWIZ_LOG_LEVEL": "info"}
    results = ranks.run(FUSED, world, env=env, timeout=90)
    assert_same_digest(reports_of(ranks, results, world))
    for r in results:
        lines = [l for l in r.err.splitlines() if "gradient buckets" in l]
        assert len(lines) == 2, ranks.report(results)[-3000:]
        assert f"in {wire} (1 rounded as the peers' float32 buckets are read)" in lines[0], lines
        assert "the optimizer step reading 1 of them as they are reduced" in lines[0], lines
        assert "as they are reduced" not in lines[1], lines


def test_three_ranks_keep_the_plain_all_reduce(ranks):
    """Beyond two ranks the plain step would read every bucket whole: it keeps the all-reduce."""
    env = {"TEST_OPT": "sgd", "TEST_SHARD": "0", "CYXWIZ_TRANSPORT": "auto", "CYXWIZ_DDP_OVERLAP": "0",
           "CYXWIZ_LOG_LEVEL": "info"}
    results = ranks.run(FUSED, 3, env=env, timeout=90)
    assert_same_digest(reports_of(ranks, results, 3))
    for r in results:
        assert "as they are reduced" not in r.err, ranks.report(results)[-3000:]


SIZES = PRELUDE + r'''
D.init()
cfg = D.DDPConfig()
cfg.bucket_size_mb = 0.01   # a bucket per parameter
cfg.shard_optimizer = os.environ["TEST_SHARD"] == "1"
# 20 x 16384 (1.25 MiB: fused), 16384 x 5 (320 KiB: larger than the window's half, under 1 MiB)
ddp = D.DistributedDataParallel(build(0, hidden=16384, extra=True), cfg)
X, y = batch(0, 8 * WS)
ddp.backward(LOSS.backward(ddp.forward(shard(X, 8)), shard(y, 8)))
ddp.update_parameters(make_opt("sgd"))
finish(digest=digest(ddp.parameters()))
'''


@pytest.mark.parametrize("shard_opt", ["0", "1"], ids=["plain", "sharded"])
@pytest.mark.parametrize("setting,fused", [(None, 1), ("1", 2)], ids=["default", "forced"])
def test_buckets_under_1_mib_take_the_all_reduce_unless_forced(ranks, shard_opt, setting, fused):
    """Under 1 MiB the fused step measured slower (ddp.cpp, kFusedStepMinBytes): by default only the
    1.25 MiB bucket is read as it is reduced; CYXWIZ_DDP_FUSED_STEP=1 takes the 320 KiB one too."""
    env = {"TEST_SHARD": shard_opt, "CYXWIZ_TRANSPORT": "auto", "CYXWIZ_DDP_OVERLAP": "0", "CYXWIZ_LOG_LEVEL": "info"}
    if setting:
        env["CYXWIZ_DDP_FUSED_STEP"] = setting
    results = ranks.run(SIZES, 2, env=env, timeout=90)
    assert_same_digest(reports_of(ranks, results, 2))
    for r in results:
        lines = [l for l in r.err.splitlines() if "gradient buckets" in l]
        assert len(lines) == 1, ranks.report(results)[-3000:]
        assert f"the optimizer step reading {fused} of them as they are reduced" in lines[0], lines
