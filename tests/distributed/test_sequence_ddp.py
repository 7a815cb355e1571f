"""A causal Transformer language model through each DDP mode, with real processes on 127.0.0.1: the
sharded optimizer step, gradient accumulation under no_sync() with overlapped buckets, and the 16-bit
gradient exchange (tests/test_sequence_layers.py covers the plain step: 2 ranks x 4 sequences == 1 x 8).

Oracles: the sharded step against the plain one in the same processes (bit-identical at 2 ranks on one
host, as tests/distributed/test_sharded_optimizer.py); accumulation against one process on the whole
batch (1e-5 of the largest value); the 16-bit exchange against sixteen_bit.ORACLE's bits, from both
ranks' own float32 gradients. The model has no dropout here: a rank's masks depend on its local sample
index, so they cannot match one process's (test_checkpoint.py resumes a model with dropout).
"""

from __future__ import annotations

import pytest
from sixteen_bit import ORACLE
from test_ddp import PRELUDE, assert_same_digest, reports_of

LM = PRELUDE + ORACLE + r'''
MODE = os.environ["TEST_MODE"]
V, T = 13, 8


def lm():
    cx.manual_seed(0)
    m = cx.SequentialModel()
    m.add(cx.EmbeddingModule(V, 16))
    m.add(cx.PositionalEncodingModule(T, 16, learned=True))
    for _ in range(2):
        m.add(cx.TransformerEncoderModule(16, 2, 32, dropout=0.0, causal=True))
    m.add(cx.LayerNormModule(16))
    m.add(cx.LinearModule(16, V))
    return m


def tokens(step, n):
    ids = np.random.default_rng([11, step]).integers(0, V, (n, T + 1))
    return ids[:, :-1], ids[:, 1:].astype(np.int64)     # next-token targets, (n, T)


def wrap(**fields):
    cfg = D.DDPConfig()
    cfg.bucket_size_mb = 0.005        # several buckets: a block's parameters span more than one
    for k, v in fields.items():
        setattr(cfg, k, v)
    return D.DistributedDataParallel(lm(), cfg)


def worst(got, want):
    return max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(got, want))


STEPS, N = 3, 8
B = N // WS
D.init()
if MODE == "sharded":
    plain, sharded = wrap(), wrap(shard_optimizer=True)
    expect(sharded.shard_optimizer and len(sharded.bucket_sizes()) > 2, f"buckets {sharded.bucket_sizes()}")
    opts = {id(plain): cx.AdamOptimizer(0.01), id(sharded): cx.AdamOptimizer(0.01)}
    for step in range(STEPS):
        X, y = tokens(step, N)
        for ddp in (plain, sharded):
            ddp.backward(LOSS.backward(ddp.forward(shard(X, B)), shard(y, B)))
            ddp.update_parameters(opts[id(ddp)])
    for i, (p, q) in enumerate(zip(sharded.parameters(), plain.parameters())):
        expect(np.array_equal(p, q), f"parameter {i}: the sharded step differs from the plain one by {np.abs(p - q).max():.3g}")
    result = sharded.parameters()
elif MODE == "no_sync":
    ACC = 2                           # micro-batches of B // ACC sequences; the last one syncs
    ddp = wrap()
    opt = cx.SGDOptimizer(0.1, momentum=0.9)
    for step in range(STEPS):
        X, y = tokens(step, N)
        xs, ys = shard(X, B), shard(y, B)
        mb = B // ACC
        with ddp.no_sync():
            ddp.backward(LOSS.backward(ddp.forward(xs[:mb]), ys[:mb]) / ACC)
        ddp.backward(LOSS.backward(ddp.forward(xs[mb:]), ys[mb:]) / ACC)
        ddp.update_parameters(opt)
    one = lm()
    opt1 = cx.SGDOptimizer(0.1, momentum=0.9)
    for step in range(STEPS):
        X, y = tokens(step, N)
        one.zero_grad()
        one.backward(LOSS.backward(one.forward(X), y))
        opt1.step(one)
    w = worst(ddp.parameters(), one.parameters())
    expect(w <= 1e-5, f"{WS} ranks x {ACC} micro-batches differ from 1 process x {N} by {w:.3g} of the largest value")
    result = ddp.parameters()
else:                                 # "bfloat16" or "float16": the exchanged bits, step by step
    ddp = wrap(gradient_dtype=MODE)
    local = lm()                      # the same parameters, no DDP: this rank's own gradients
    opt, opt_local = cx.SGDOptimizer(0.1), cx.SGDOptimizer(0.1)
    for step in range(STEPS):
        X, y = tokens(step, N)
        xs, ys = shard(X, B), shard(y, B)
        ddp.backward(LOSS.backward(ddp.forward(xs), ys))
        got = flat(ddp.sync_gradients())
        local.zero_grad()
        local.backward(LOSS.backward(local.forward(xs), ys))
        g0, g1 = D.all_gather(flat(local.gradients()))
        expect_exchanged(got, g0, g1, MODE, step)
        # both step on the exchanged gradients, so the next step's local gradients are the ranks' own
        for g, src in zip(local.gradients(), ddp.gradients()):
            g[...] = src
        ddp.update_parameters(opt)
        opt_local.step(local)
    result = ddp.parameters()
finish(digest=digest(result))
'''


@pytest.mark.parametrize("mode,overlap", [("sharded", "0"), ("sharded", "1"), ("no_sync", "1"), ("no_sync", "0"),
                                          ("bfloat16", "1"), ("float16", "0")])
def test_a_language_model_through_each_ddp_mode(ranks, mode, overlap):
    env = {"TEST_MODE": mode, "CYXWIZ_DDP_OVERLAP": overlap}
    reports = reports_of(ranks, ranks.run(LM, 2, env=env, timeout=90), 2)
    assert_same_digest(reports)
