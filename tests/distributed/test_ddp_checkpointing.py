"""DistributedDataParallel over a model with gradient checkpointing (set_gradient_checkpointing).

The oracle is the same DDP training without checkpointing, run by the same ranks from the same seed
right before: every rank trains both and compares them bit for bit (checkpointing replays the same
kernels and Dropout masks, and each layer still hands its gradients to its bucket as its backward
ends). The steps accumulate two micro-batches (the first under no_sync) before each Adam step, with
tiny buckets (one all-reduce per layer) and the all-reduces launched during backward
(CYXWIZ_DDP_OVERLAP=1, the path in which a recomputed segment's forward runs while later layers'
buckets are on the wire) and at sync time; and with the sharded optimizer step, also with bfloat16
gradient exchange (DDPConfig.gradient_dtype).
"""

from __future__ import annotations

import pytest
from test_ddp import PRELUDE, assert_same_digest, reports_of

SCRIPT = PRELUDE + r'''
D.init()
B = 8


def model(segments):
    cx.manual_seed(3)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(20, 32), cx.ReLUModule(), cx.DropoutModule(0.2), cx.LinearModule(32, 32),
                  cx.TanhModule(), cx.LinearModule(32, 32), cx.ReLUModule(), cx.DropoutModule(0.1),
                  cx.LinearModule(32, 5)):
        m.add(layer)
    m.set_gradient_checkpointing(segments)
    return m


def train(segments):
    m = model(segments)
    cfg = D.DDPConfig()
    cfg.bucket_size_mb = 0.0001
    cfg.gradient_dtype = os.environ["TEST_GRADIENT_DTYPE"]
    ddp = D.DistributedDataParallel(m, cfg)
    opt = cx.AdamOptimizer(0.01)
    for step in range(4):
        X, y = batch(step, 2 * B * WS)
        for micro in range(2):
            xs, ys = shard(X[micro * B * WS:], B), shard(y[micro * B * WS:], B)
            if micro == 0:
                with ddp.no_sync():
                    ddp.backward(LOSS.backward(ddp(xs), ys))
            else:
                ddp.backward(LOSS.backward(ddp(xs), ys))
        ddp.update_parameters(opt)
    params = copies(ddp.parameters())
    del ddp
    return params, cx.get_rng_state()


plain, rng_plain = train(0)
for segments in (2, 4):
    got, rng = train(segments)
    for i, (p, q) in enumerate(zip(got, plain)):
        expect(np.array_equal(p, q), f"segments={segments}: parameter {i} differs from plain DDP training "
               f"(max |diff| {np.abs(p - q).max():.3g})")
    expect(rng == rng_plain, f"segments={segments}: the random stream ends elsewhere")
finish(digest=digest(plain))
'''


@pytest.mark.parametrize("overlap,shard,dtype", [("1", "0", "float32"), ("0", "0", "float32"), ("1", "1", "float32"),
                                                 ("1", "1", "bfloat16")])
def test_checkpointed_ddp_equals_plain_ddp(ranks, overlap, shard, dtype):
    env = {"CYXWIZ_DDP_OVERLAP": overlap, "CYXWIZ_DDP_SHARD_OPTIMIZER": shard, "TEST_GRADIENT_DTYPE": dtype}
    results = ranks.run(SCRIPT, 2, env=env, timeout=60)
    assert_same_digest(reports_of(ranks, results, 2))


FIT = PRELUDE + r'''
D.init()
rng = np.random.default_rng(5)
X = rng.standard_normal((150, 20)).astype(np.float32)   # 150 = 2 ranks x (4 x 16 + 11): short last batches
y = rng.integers(0, 5, 150)


def fit(segments):
    cx.manual_seed(3)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(20, 32), cx.ReLUModule(), cx.DropoutModule(0.2), cx.LinearModule(32, 32),
                  cx.ReLUModule(), cx.LinearModule(32, 5)):
        m.add(layer)
    m.set_gradient_checkpointing(segments)
    trainer = D.DistributedTrainer(m, LOSS, cx.AdamOptimizer(0.01))
    config = D.DistributedTrainingConfig()
    config.epochs, config.batch_size, config.verbose, config.validation_split = 2, 16, False, 0.1
    h = trainer.fit(X, y, config)
    return copies(m.parameters()), (h.train_losses, h.val_losses, h.train_accuracies)


plain, history = fit(0)
got, got_history = fit(3)
expect(all(np.array_equal(p, q) for p, q in zip(got, plain)), "fit with segments=3: parameters differ from plain fit")
expect(got_history == history, f"fit with segments=3: history {got_history} != plain {history}")
finish(digest=digest(plain))
'''


def test_checkpointed_fit_equals_plain_fit(ranks):
    """DistributedTrainer.fit over a checkpointed model (evaluation runs in eval mode: no segments)."""
    results = ranks.run(FIT, 2, timeout=60)
    assert_same_digest(reports_of(ranks, results, 2))
