"""Mixed precision across ranks, with real processes on 127.0.0.1.

- bf16 through DistributedTrainer.fit(mixed_precision="bf16") on digits (2 ranks): test accuracy
  >= 95% and, epoch by epoch over ~200 steps, the training loss within 2% of the float32 fit's; the
  ranks end with the same bits.
- fp16 with a GradScaler in a hand-written DDP loop survives a planted overflow (one rank's loss
  gradient column times 1e30): the step is skipped on EVERY rank (also with the sharded step, where
  each rank checks only its own part of the gradients, and the overflow lies in one rank's part), the scale backs off on every rank, training goes
  on and the parameters stay identical across ranks.
- A checkpoint keeps the loss scale: a run resumed from it ends bit-identical to the uninterrupted
  one, with the same scale.
- A rank with another mixed_precision is refused on every rank, the rank named.
"""

from __future__ import annotations

import pytest
from sixteen_bit import DIGITS_DATA
from test_ddp import PRELUDE, assert_same_digest, reports_of

DIGITS = PRELUDE + DIGITS_DATA + r'''
D.init()


def run(mixed):
    cx.manual_seed(7)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(64, 128), cx.ReLUModule(), cx.LinearModule(128, 128), cx.ReLUModule(),
                  cx.LinearModule(128, 10)):
        m.add(layer)
    trainer = D.DistributedTrainer(m, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.002))
    cfg = D.DistributedTrainingConfig()
    cfg.epochs, cfg.batch_size, cfg.verbose, cfg.seed = 9, 32, False, 3   # 22 steps an epoch: 198 steps
    cfg.mixed_precision = mixed
    history = trainer.fit(Xtr, ytr, cfg)
    _, accuracy = trainer.evaluate(Xte, yte)
    return np.array(history.train_losses), accuracy, m


l32, a32, _ = run(None)
l16, a16, model = run("bf16")
gap = float(np.max(np.abs(l16 - l32) / l32))
expect(a16 >= 0.95, f"bf16: test accuracy {a16:.4f} < 0.95 (float32: {a32:.4f})")
expect(gap <= 0.02, f"bf16: an epoch's training loss strayed {gap:.2%} from the float32 fit's: {l16} vs {l32}")
expect(not np.array_equal(l16, l32), "bf16 fit identical to float32: was autocast used?")
finish(accuracy=a16, accuracy32=a32, gap=gap, losses=l16.tolist(), losses32=l32.tolist(), digest=digest(model.parameters()))
'''


def test_digits_train_to_95_percent_in_bf16_on_two_ranks(ranks):
    reports = reports_of(ranks, ranks.run(DIGITS, 2, timeout=180), 2)
    assert_same_digest(reports)
    print({k: reports[0][k] for k in ("accuracy", "accuracy32", "gap")})


OVERFLOW = PRELUDE + r'''
shard_opt = os.environ["TEST_SHARD"] == "1"
D.init()
cfg = D.DDPConfig()
cfg.bucket_size_mb = 0.002        # several buckets
cfg.shard_optimizer = shard_opt
if os.environ["TEST_MODEL"] == "mlp":
    model = build(0, hidden=64, extra=True)
else:   # one layer: an overflow in one output column reaches only its weight row and bias, rank 1's shard
    cx.manual_seed(0)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(20, 5))
ddp = D.DistributedDataParallel(model, cfg)
opt = cx.AdamOptimizer(0.01)
scaler = cx.GradScaler(init_scale=2.0 ** 12, growth_interval=1000)
PLANT, STEPS, B = 4, 12, 16
losses, scales, taken = [], [], []
for step in range(STEPS):
    X, y = batch(step % 3, B * WS)
    xs, ys = shard(X, B), shard(y, B)
    with cx.autocast("float16"):
        out = ddp.forward(xs)
    losses.append(float(LOSS.forward(out, ys)))
    g = scaler.scale(LOSS.backward(out, ys))
    if step == PLANT and RANK == 1:
        g[:, 4] *= np.float32(1e30)   # only rank 1 overflows (in float16, in backward): every rank must skip
    ddp.backward(g)
    before = copies(ddp.parameters())
    taken.append(scaler.step(opt, ddp))
    scaler.update()
    scales.append(scaler.get_scale())
    grads = ddp.gradients()
    expect(all(not np.any(g) for g in grads), f"step {step}: gradients not zeroed after scaler.step")
    if step == PLANT:
        expect(all(np.array_equal(p, q) for p, q in zip(ddp.parameters(), before)),
               f"step {step}: the skipped step changed the parameters")
want = [s != PLANT for s in range(STEPS)]
expect(taken == want, f"steps taken {taken}, expected all but step {PLANT}")
expect(scales[PLANT] == 2.0 ** 11 and scales[PLANT - 1] == 2.0 ** 12, f"scales {scales}: no back-off at step {PLANT}")
expect(opt.step_count == STEPS - 1, f"optimizer stepped {opt.step_count} times")
expect(all(np.isfinite(p).all() for p in ddp.parameters()), "non-finite parameters")
expect(losses[-1] < losses[2], f"training did not go on: losses {losses}")
gathered = D.all_gather(flat(ddp.parameters()))
expect(all(np.array_equal(g, gathered[0]) for g in gathered), "parameters differ across ranks")
finish(digest=digest(ddp.parameters()), scales=scales, taken=taken)
'''


@pytest.mark.parametrize("shard_opt,model", [(False, "mlp"), (True, "mlp"), (True, "linear")],
                         ids=["allreduce", "sharded", "sharded-one-shard"])
def test_fp16_planted_overflow_is_skipped_on_every_rank(ranks, shard_opt, model):
    # "sharded-one-shard": the Inf/NaN lands in rank 1's part of the reduce-scattered bucket only, so
    # rank 0 sees finite gradients: the ranks must agree on the skip all the same.
    env = {"TEST_SHARD": "1" if shard_opt else "0", "TEST_MODEL": model}
    reports = reports_of(ranks, ranks.run(OVERFLOW, 2, env=env, timeout=90), 2)
    assert_same_digest(reports)
    assert reports[0]["scales"] == reports[1]["scales"]


RESUME = PRELUDE + r'''
ckdir = os.environ["TEST_DIR"]
D.init()
rng = np.random.default_rng(0)
X = rng.standard_normal((256, 20)).astype(np.float32)
y = (X[:, :5].argmax(1)).astype(np.int64)


def trainer_for(epochs, resume=""):
    m = build(0, hidden=32, extra=True)
    t = D.DistributedTrainer(m, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    t.grad_scaler = cx.GradScaler(init_scale=2.0 ** 8, growth_interval=5)
    cfg = D.DistributedTrainingConfig()
    cfg.epochs, cfg.batch_size, cfg.verbose = epochs, 16, False
    cfg.mixed_precision = "fp16"
    cfg.checkpoint_every_n_epochs = 1
    cfg.checkpoint_dir = ckdir + ("/resumed" if resume else "")
    cfg.resume_from_checkpoint = resume
    return t, m, cfg


t, m, cfg = trainer_for(3)
t.fit(X, y, cfg)
full = (digest(m.parameters()), t.grad_scaler.state_dict())
expect(full[1]["scale"] > 2.0 ** 8, f"the scale never grew: {full[1]}")   # 8 steps an epoch, growth every 5
D.barrier()
t2, m2, cfg2 = trainer_for(3, resume=ckdir + "/checkpoint_epoch_0002.ckpt")
t2.fit(X, y, cfg2)
resumed = (digest(m2.parameters()), t2.grad_scaler.state_dict())
expect(resumed == full, f"resumed run {resumed} != uninterrupted {full}")
t3, _, _ = trainer_for(3)
t3.grad_scaler = None
t3.load_checkpoint(ckdir + "/checkpoint_epoch_0002.ckpt")
expect(t3.grad_scaler is not None and t3.grad_scaler.get_scale() > 0, "load_checkpoint did not restore a scaler")
finish(digest=full[0], state=full[1])
'''


def test_checkpoint_resume_keeps_the_loss_scale(ranks, tmp_path):
    reports = reports_of(ranks, ranks.run(RESUME, 2, env={"TEST_DIR": str(tmp_path)}, timeout=120), 2)
    assert_same_digest(reports)


MISMATCH = PRELUDE + r'''
D.init()
t = D.DistributedTrainer(build(0), cx.CrossEntropyLoss(), cx.SGDOptimizer(0.1))
cfg = D.DistributedTrainingConfig()
cfg.epochs, cfg.verbose = 1, False
cfg.mixed_precision = "bf16" if RANK == 1 else None
X = np.zeros((8, 20), np.float32)
try:
    t.fit(X, np.zeros(8, np.int64), cfg)
    expect(False, "fit with different mixed_precision settings went through")
except ValueError as e:
    expect("rank 1 (differs from rank 0): mixed_precision='bf16'" in str(e), f"message: {e}")
finish()
'''


def test_ranks_with_different_mixed_precision_are_refused(ranks):
    reports_of(ranks, ranks.run(MISMATCH, 2, timeout=60), 2)


VERSION1 = PRELUDE + r'''
import struct, zlib
D.init()
path = os.environ["TEST_DIR"] + "/v2.ckpt"
t = D.DistributedTrainer(build(0), cx.CrossEntropyLoss(), cx.SGDOptimizer(0.1))
t.save_checkpoint(path)
raw = open(path, "rb").read()
HEADER = 24   # magic | version u32 | reserved u32 | payload size u64; the payload's crc32 closes the file
payload = raw[HEADER:-4]
expect(struct.unpack("<I", raw[8:12])[0] == 2, "checkpoints are not written as version 2")
expect(payload.endswith(struct.pack("<I", 0) + b"\x00"), "no mixed-precision section (None, no scaler) at the end")
old = payload[:-5]   # what version 1 wrote: everything up to the history
v1 = raw[:8] + struct.pack("<I", 1) + raw[12:16] + struct.pack("<Q", len(old)) + old + struct.pack("<I", zlib.crc32(old))
open(path + ".v1", "wb").write(v1)
t.load_checkpoint(path + ".v1")
expect(t.grad_scaler is None, "a version 1 checkpoint brought a loss scaler")
finish()
'''


def test_version_1_checkpoints_still_load(ranks, tmp_path):
    reports_of(ranks, ranks.run(VERSION1, 1, env={"TEST_DIR": str(tmp_path)}, timeout=60), 1)


TRAIN_STEP = PRELUDE + r'''
D.init()
model = build(0, hidden=32)
ddp = D.DistributedDataParallel(model)
scaler = cx.GradScaler(init_scale=2.0 ** 20, growth_interval=3)
step = D.TrainStep(ddp, LOSS, cx.AdamOptimizer(0.01), mixed_precision="fp16", grad_scaler=scaler)
expect(step.grad_scaler is scaler, "TrainStep did not take the GradScaler it was given")
bf = D.TrainStep(D.DistributedDataParallel(build(0, hidden=32)), LOSS, cx.AdamOptimizer(0.01), mixed_precision="bf16")
expect(bf.grad_scaler is None, "bf16 made a GradScaler")
for s in range(8):
    X, y = batch(s % 2, 32)
    step(X, y)
    bf(X, y)
expect(np.isfinite(step.loss()) and np.isfinite(bf.loss()), f"losses {step.loss()} {bf.loss()}")
expect(model[0]._saved_tensors()[0]["dtype"] == "float16", f"the step did not run under autocast: {model[0]._saved_tensors()}")
expect(scaler.get_scale() != 2.0 ** 20, f"the scale never moved: {scaler.state_dict()}")
try:
    D.TrainStep(ddp, LOSS, cx.SGDOptimizer(0.1), mixed_precision="fp8")
    expect(False, "mixed_precision='fp8' accepted")
except ValueError as e:
    expect("'bf16' or 'fp16'" in str(e), str(e))
finish()
'''


def test_train_step_takes_mixed_precision(ranks):
    reports_of(ranks, ranks.run(TRAIN_STEP, 1, timeout=60), 1)
