"""DistributedDataParallel with a sharded optimizer step (DDPConfig.shard_optimizer, ZeRO stage 1), with
real processes on 127.0.0.1.

Oracles: in the same processes, the same model wrapped without sharding and trained on the same
batches (2 ranks on one host: bit-identical, since each element is reduced once, by one rank, and a
sum of two floats does not depend on their order; 3 ranks or TCP: within float32 rounding), and one process trained on the whole global
batch. The optimizer state put together from the shards (ddp.optimizer_state_dict) must equal the
unsharded optimizer's state_dict(). Misuse raises on every rank with the remedy.
"""

from __future__ import annotations

import pytest
from test_ddp import PRELUDE, assert_same_digest, reports_of

import pycyxwiz as cx

D = cx.distributed

EQUIVALENCE = PRELUDE + r'''
kind, hidden = os.environ["TEST_OPT"], int(os.environ["TEST_HIDDEN"])
exact = os.environ["TEST_EXACT"] == "1"
STEPS, N = 4, 60
B = N // WS
D.init()


def wrap(shard):
    cfg = D.DDPConfig()
    cfg.bucket_size_mb = 0.25      # several buckets, and a layer split across ranks within one
    cfg.shard_optimizer = shard
    return D.DistributedDataParallel(build(0, hidden=hidden, extra=True), cfg)


plain, sharded = wrap(False), wrap(True)
expect(sharded.shard_optimizer and not plain.shard_optimizer, "shard_optimizer property")
opt_plain, opt_sharded = make_opt(kind), make_opt(kind)
for step in range(STEPS):
    X, y = batch(step, N)
    xs, ys = shard(X, B), shard(y, B)
    for ddp, opt in ((plain, opt_plain), (sharded, opt_sharded)):
        out = ddp.forward(xs)
        ddp.backward(LOSS.backward(out, ys))
        ddp.update_parameters(opt)
        expect(all(not np.any(g) for g in ddp.gradients()), f"step {step}: gradients not zeroed")
for i, (p, q) in enumerate(zip(sharded.parameters(), plain.parameters())):
    if exact:
        expect(np.array_equal(p, q), f"parameter {i}: sharded differs from plain by {np.abs(p - q).max():.3g}")
    else:
        close(f"parameter {i}: sharded vs plain", p, q, rtol=1e-5, atol=1e-6)

# one process on the whole batch
# Adam scales each element's step by 1/sqrt(v): where a gradient is near zero, float32 rounding of the
# N-rank average (against the one-process mean) moves the step by a visible fraction of lr.
tol = dict(rtol=1e-3, atol=1e-4) if kind == "adam" else dict(rtol=1e-4, atol=1e-5)
check_params("sharded vs 1 process", sharded.parameters(), oracle(kind, STEPS, N, hidden=hidden, extra=True), **tol)

# the state: refused per rank, whole when put together
try:
    opt_sharded.state_dict()
    expect(False, "state_dict() of a sharded optimizer did not raise")
except ValueError as e:
    expect("ddp.optimizer_state_dict(optimizer)" in str(e), f"state_dict message: {e}")
whole, want = sharded.optimizer_state_dict(opt_sharded), opt_plain.state_dict()
expect(sorted(whole) == sorted(want), f"state keys {sorted(whole)} vs {sorted(want)}")
for key in want:
    if isinstance(want[key], float):
        expect(whole[key] == want[key], f"state {key}: {whole[key]} vs {want[key]}")
    elif exact:
        expect(np.array_equal(whole[key], want[key]), f"state {key} differs")
    else:
        close(f"state {key}", whole[key], want[key], rtol=1e-5, atol=1e-7)
gathered = D.all_gather(flat(sharded.parameters()))
expect(all(np.array_equal(g, gathered[0]) for g in gathered), "parameters differ across ranks")
finish(digest=digest(sharded.parameters()))
'''


@pytest.mark.parametrize("world_size,transport,hidden,kind,overlap,exact", [
    (2, "auto", 16, "adam", "0", True),      # buckets below a window: the copying path
    (2, "auto", 4096, "adam", "0", True),    # a bucket over a window (344 KB): read in shared memory
    (2, "auto", 4096, "sgd", "1", True),     # reduce-scatter during backward
    (3, "auto", 4096, "adam", "1", False),
    (2, "tcp", 2048, "adam", "0", False),
    (3, "tcp", 300, "sgd", "0", False),
])
def test_sharded_step_equals_the_plain_one(ranks, world_size, transport, hidden, kind, overlap, exact):
    env = {"TEST_OPT": kind, "TEST_HIDDEN": hidden, "TEST_EXACT": "1" if exact else "0",
           "CYXWIZ_TRANSPORT": transport, "CYXWIZ_DDP_OVERLAP": overlap}
    reports = reports_of(ranks, ranks.run(EQUIVALENCE, world_size, env=env, timeout=90), world_size)
    assert_same_digest(reports)


MISUSE = PRELUDE + r'''
D.init()
cfg = D.DDPConfig()
cfg.shard_optimizer = True
model = build(0)
ddp = D.DistributedDataParallel(model, cfg)
opt = make_opt("adam")
X, y = batch(0, 8 * WS)
xs, ys = shard(X, 8), shard(y, 8)
ddp.backward(LOSS.backward(ddp.forward(xs), ys))
ddp.update_parameters(opt)                      # now the optimizer holds one shard of the state
ddp.backward(LOSS.backward(ddp.forward(xs), ys))
try:
    opt.step(model)
    expect(False, "optimizer.step on a sharded optimizer did not raise")
except ValueError as e:
    expect("ddp.update_parameters(optimizer)" in str(e), f"step message: {e}")
# sync_gradients gives whole averaged gradients; an optimizer that is not sharded may step on them
grads = ddp.sync_gradients()
sums = D.all_gather(np.concatenate([g.ravel() for g in grads]))
expect(all(np.array_equal(s, sums[0]) for s in sums), "sync_gradients: gradients differ across ranks")
finish()
'''


def test_sharded_optimizer_refuses_a_step_outside_ddp(ranks):
    reports_of(ranks, ranks.run(MISUSE, 2, timeout=60), 2)


def test_shard_optimizer_from_the_environment(ranks):
    code = PRELUDE + r'''
D.init()
ddp = D.DistributedDataParallel(build(0))
expect(ddp.shard_optimizer, "CYXWIZ_DDP_SHARD_OPTIMIZER=1 did not shard the step")
finish()
'''
    reports_of(ranks, ranks.run(code, 2, env={"CYXWIZ_DDP_SHARD_OPTIMIZER": "1"}, timeout=60), 2)
    assert "shard_optimizer=False" in repr(D.DDPConfig())
