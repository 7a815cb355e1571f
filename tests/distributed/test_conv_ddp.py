"""Convolutional models data-parallel: SyncBatchNorm, buffers, and the trainer on images.

SyncBatchNorm's oracle is one process on the whole global batch: with every BatchNorm synchronised,
2 ranks x 16 rows must end where 1 process x 32 rows ends after several SGD steps (parameters and
running statistics, 1e-5 relative), with bit-identical buffers on the ranks. Without it, each rank's
BatchNorm sees its own rows: the same 2-rank run then does not match the oracle (the control that
shows the test can fail). broadcast_buffers: a training forward first takes rank 0's buffers, so
ranks that see the same batch end with the same statistics; with it off they keep their own.
"""

from __future__ import annotations

import pytest
from test_ddp import PRELUDE, reports_of, assert_same_digest

CNN = PRELUDE + r'''
def cnn(seed=0):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    for layer in (cx.Conv2DModule(2, 6, 3, padding=1), cx.BatchNorm2DModule(6), cx.ReLUModule(), cx.MaxPool2DModule(2),
                  cx.Conv2DModule(6, 8, 3, padding=1, use_bias=False), cx.BatchNorm2DModule(8), cx.ReLUModule(),
                  cx.GlobalAvgPool2DModule(), cx.BatchNorm1DModule(8), cx.LinearModule(8, 5)):
        m.add(layer)
    return m


def images(step, n):
    rng = np.random.default_rng([99, step])
    X = (rng.standard_normal((n, 2, 8, 8)) * 2 + 0.5).astype(np.float32)
    return X, rng.integers(0, 5, n).astype(np.int64)


def state(model):
    return [np.array(p, copy=True) for p in model.parameters()] + [np.asarray(b, np.float64).copy() for b in model.buffers()]
'''

SYNC_BN = CNN + r'''
STEPS, N = 4, 32
B = N // WS
sync = os.environ["TEST_SYNC"] == "1"
D.init()
model = cnn()
if sync:
    D.convert_sync_batchnorm(model)
    expect("sync=True" in repr(model), "convert_sync_batchnorm did not mark the layers")
cfg = D.DDPConfig()
cfg.shard_optimizer = os.environ.get("TEST_SHARD") == "1"
ddp = D.DistributedDataParallel(model, cfg)
expect(ddp.shard_optimizer == cfg.shard_optimizer, "shard_optimizer not in effect")
opt = cx.SGDOptimizer(0.1, momentum=0.9)
for step in range(STEPS):
    X, y = images(step, N)
    out = ddp.forward(shard(X, B))
    ddp.backward(LOSS.backward(out, shard(y, B)))
    ddp.update_parameters(opt)
# The oracle: one process, the whole batch, plain BatchNorm.
one = cnn()
opt1 = cx.SGDOptimizer(0.1, momentum=0.9)
for step in range(STEPS):
    X, y = images(step, N)
    out = one.forward(X)
    one.zero_grad()
    one.backward(LOSS.backward(out, y))
    opt1.step(one)
mine, want = state(model), state(one)
worst = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(mine, want))
finish(digest=digest(model.buffers()) + digest(model.parameters()), worst=worst)
'''


@pytest.mark.parametrize("sync,shard", [(True, False), (False, False), (True, True)], ids=["sync", "control", "sharded"])
def test_sync_batchnorm_two_ranks_equal_one_process(ranks, sync, shard):
    """With the sharded optimizer step too (ZeRO-1: convolution weights updated as slices of a bucket)."""
    results = ranks.run(SYNC_BN, 2, env={"TEST_SYNC": "1" if sync else "0", "TEST_SHARD": "1" if shard else "0"},
                        timeout=60)
    reports = reports_of(ranks, results, 2)
    worst = max(rep["worst"] for rep in reports)
    if sync:
        assert worst <= 1e-5, f"2 ranks x 16 with SyncBatchNorm differ from 1 x 32 by {worst:.3g} of the largest value"
        assert_same_digest(reports)  # buffers and parameters bit-identical on the ranks
    else:
        assert worst > 1e-3, f"without SyncBatchNorm the ranks still matched the oracle ({worst:.3g}): the test cannot fail"


BUFFERS = CNN + r'''
D.init()
cfg = D.DDPConfig()
cfg.broadcast_buffers = os.environ["TEST_BROADCAST"] == "1"
model = cnn()
ddp = D.DistributedDataParallel(model, cfg)
opt = cx.SGDOptimizer(0.1)
for step in range(3):
    X, y = images(100 + 10 * RANK + step, 8)  # each rank its own rows: different statistics
    out = ddp.forward(X)
    ddp.backward(LOSS.backward(out, y))
    ddp.update_parameters(opt)
X, y = images(7, 8)  # one more training forward on the same rows everywhere
ddp.forward(X)
finish(buffers=digest(model.buffers()), params=digest(model.parameters()))
'''


@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "own"])
def test_broadcast_buffers_sends_rank_0s_statistics(ranks, broadcast):
    results = ranks.run(BUFFERS, 2, env={"TEST_BROADCAST": "1" if broadcast else "0"}, timeout=60)
    reports = reports_of(ranks, results, 2)
    assert_same_digest(reports, "params")
    if broadcast:
        assert_same_digest(reports, "buffers")
    else:
        assert reports[0]["buffers"] != reports[1]["buffers"], "broadcast_buffers=False still made the buffers equal"


FIT = CNN + r'''
D.init()
model = cnn()
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
rng = np.random.default_rng(5)
X = rng.standard_normal((96, 2, 8, 8)).astype(np.float32)
y = (X[:, 0, :4].mean(axis=(1, 2)) > 0).astype(np.int64)  # learnable: the sign of a region's mean
cfg = D.DistributedTrainingConfig()
cfg.epochs, cfg.batch_size, cfg.verbose = 8, 16, False
history = trainer.fit(X, y, cfg)
loss, acc = trainer.evaluate(X, y)
pred = trainer.predict(X[:10])
expect(pred.shape == (10, 5), f"predict shape {pred.shape}")
expect(acc >= 0.9, f"training accuracy {acc}")
finish(digest=digest(model.parameters()) + digest(model.buffers()), acc=acc)
'''


def test_trainer_fits_images_on_two_ranks(ranks):
    results = ranks.run(FIT, 2, timeout=90)
    reports = reports_of(ranks, results, 2)
    assert_same_digest(reports)


RESUME = CNN + r'''
import pathlib
HERE = pathlib.Path(os.environ["TEST_DIR"])
D.init()
rng = np.random.default_rng(8)
X = rng.standard_normal((64, 2, 8, 8)).astype(np.float32)
y = rng.integers(0, 5, 64).astype(np.int64)


def config(**kw):
    cfg = D.DistributedTrainingConfig()
    cfg.batch_size, cfg.shuffle, cfg.seed, cfg.verbose, cfg.checkpoint_every_n_epochs = 8, True, 3, False, 1
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def state(model):
    return digest(model.parameters()) + digest([np.asarray(b, np.float64) for b in model.buffers()])


straight = cnn()
D.convert_sync_batchnorm(straight)
D.DistributedTrainer(straight, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01)).fit(
    X, y, config(epochs=4, checkpoint_dir=str(HERE / "full")))
first = cnn()
D.convert_sync_batchnorm(first)
D.DistributedTrainer(first, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01)).fit(X, y, config(epochs=2, checkpoint_dir=str(HERE / "ck")))
resumed = cnn(seed=5)  # other weights and fresh statistics: the checkpoint must bring both back
D.convert_sync_batchnorm(resumed)
D.DistributedTrainer(resumed, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01)).fit(
    X, y, config(epochs=4, checkpoint_dir=str(HERE / "ck"), resume_from_checkpoint="latest"))
expect(state(resumed) == state(straight), "2 epochs + resume + 2 epochs differ from 4 epochs straight")
expect(int(dict(resumed.named_buffers())["1.num_batches_tracked"]) == 4 * 64 // (8 * WS),
       f"num_batches_tracked {dict(resumed.named_buffers())['1.num_batches_tracked']}")
finish(digest=state(resumed))
'''


def test_checkpoint_resume_restores_buffers(ranks, tmp_path):
    """A CNN with SyncBatchNorm trained 2 epochs, checkpointed, resumed into a model with other weights
    and fresh running statistics for 2 more, ends bit-identical to 4 epochs straight."""
    results = ranks.run(RESUME, 2, env={"TEST_DIR": str(tmp_path)}, timeout=90)
    reports = reports_of(ranks, results, 2)
    assert_same_digest(reports)
