"""cx.distributed.DistributedTrainer with real processes on 127.0.0.1: fit, evaluate, predict, history,
output, learning-rate scaling.

Oracles, not hard-coded numbers: two ranks with per-rank batch B against one process with batch 2B
(the averaged gradients of two halves are the gradient of the whole batch); fit against the same
loop written by hand with DistributedSampler + DistributedDataParallel; validation_split against the
same rows passed as explicit validation data; evaluate/predict on N ranks against model.forward on
the whole set in one process, with numpy.

Every rank script writes its results as JSON to out/<tag>.<rank>.json in the test's tmp_path. Float32
parameters travel as Python floats (exact) plus a sha256 of their raw bytes.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from trainer_scripts import RANK_PRELUDE, UNSET, outputs, run

import pycyxwiz as cx


PRELUDE = RANK_PRELUDE + r'''
HISTORY = ("train_losses", "train_accuracies", "val_losses", "val_accuracies", "total_time_seconds",
           "samples_per_second", "effective_batch_size", "world_size", "start_epoch")
'''


def arrays(p: list) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float32) for a in p]


def assert_same_on_every_rank(reports: list[dict], *keys: str) -> None:
    for key in keys:
        for r, rep in enumerate(reports[1:], start=1):
            assert rep[key] == reports[0][key], f"{key} differs between rank 0 and rank {r}"


def assert_same_histories(reports: list[dict]) -> None:
    for key in ("train_losses", "train_accuracies", "val_losses", "val_accuracies", "effective_batch_size",
                "world_size", "start_epoch"):
        for r, rep in enumerate(reports[1:], start=1):
            assert rep["history"][key] == reports[0]["history"][key], \
                f"history.{key} differs between rank 0 ({reports[0]['history'][key]}) and rank {r} ({rep['history'][key]})"


# ------------------------------------------------------------------------------------ fit: it learns

LEARN = PRELUDE + r'''
D.init()
X, y = blobs(400, seed=1)
Xt, yt = blobs(400, seed=2)
model = build(seed=0)
before = digest(model)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
h = trainer.fit(X, y, config(epochs=6, batch_size=16))
test_loss, test_acc = trainer.evaluate(Xt, yt)
dump("learn", history=hist(h), params=params(model), digest=digest(model), before=before,
     via_trainer=digest(trainer.get_model()), via_ddp=digest(trainer.get_ddp().get_model()),
     test=[test_loss, test_acc], rank=trainer.get_rank(), world=trainer.get_world_size(),
     master=trainer.is_master(), ddp_rank=trainer.get_ddp().get_rank(),
     ddp_world=trainer.get_ddp().get_world_size())
'''


@pytest.mark.parametrize("world_size", [1, 2])
def test_fit_learns_and_fills_the_history(ranks, world_size):
    run(ranks, LEARN, world_size)
    reports = outputs(ranks, "learn", world_size)
    epochs, batch, n = 6, 16, 400
    for r, rep in enumerate(reports):
        h = rep["history"]
        assert rep["rank"] == rep["ddp_rank"] == r
        assert rep["world"] == rep["ddp_world"] == world_size
        assert rep["master"] is (r == 0)
        # the trainer trains the user's model object (Quick Start saves `model` after fit)
        assert rep["digest"] != rep["before"], "fit did not change the model that was passed in"
        assert rep["digest"] == rep["via_trainer"] == rep["via_ddp"]
        assert len(h["train_losses"]) == len(h["train_accuracies"]) == epochs, h
        assert h["val_losses"] == [] and h["val_accuracies"] == [], "no validation data, yet val metrics"
        assert h["effective_batch_size"] == batch * world_size
        assert h["world_size"] == world_size
        assert h["start_epoch"] == 0
        assert h["total_time_seconds"] > 0 and h["samples_per_second"] > 0, h
        # samples_per_second is global: all ranks' samples over the wall time
        processed = h["samples_per_second"] * h["total_time_seconds"]
        assert 0.75 * epochs * n <= processed <= 1.25 * epochs * n, \
            f"samples_per_second * total_time_seconds = {processed:.0f}, expected about {epochs * n} samples"
        assert all(math.isfinite(v) and v >= 0 for v in h["train_losses"]), h["train_losses"]
        assert all(0.0 <= a <= 1.0 for a in h["train_accuracies"]), h["train_accuracies"]
        assert h["train_losses"][-1] < h["train_losses"][0], h["train_losses"]
        assert h["train_accuracies"][-1] > 0.9, h["train_accuracies"]
        assert rep["test"][1] > 0.9, f"held-out accuracy {rep['test'][1]}"
    # metrics are reduced across ranks, parameters stay in step
    assert_same_histories(reports)
    assert_same_on_every_rank(reports, "digest", "test")


# ------------------------------------------------ two ranks with batch B == one process with batch 2B

EQUIV = PRELUDE + r'''
D.init()
W = D.get_world_size()
B = int(os.environ["GLOBAL_BATCH"]) // W
X, y = blobs(384, seed=3)          # 288 training rows = 9 global batches of 32, 96 validation rows
model = build(seed=5)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.SGDOptimizer(0.05, momentum=0.9))
h = trainer.fit(X, y, config(epochs=3, batch_size=B, shuffle=os.environ["SHUFFLE"] == "1", seed=7,
                             validation_split=0.25))
dump("equiv", history=hist(h), params=params(model), digest=digest(model))
'''


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_two_ranks_match_one_process_with_the_whole_batch(ranks, shuffle):
    env = {"GLOBAL_BATCH": 32, "SHUFFLE": int(shuffle)}
    run(ranks, EQUIV, 1, env=env)
    [one] = outputs(ranks, "equiv", 1)
    run(ranks, EQUIV, 2, env=env)
    two = outputs(ranks, "equiv", 2)
    assert_same_histories(two)
    assert_same_on_every_rank(two, "digest")
    for a, b in zip(arrays(one["params"]), arrays(two[0]["params"])):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5, err_msg="parameters: 2 ranks x 16 vs 1 x 32")
    h1, h2 = one["history"], two[0]["history"]
    assert len(h2["train_losses"]) == len(h2["val_losses"]) == 3
    np.testing.assert_allclose(h2["train_losses"], h1["train_losses"], rtol=2e-4, err_msg="train_losses")
    np.testing.assert_allclose(h2["val_losses"], h1["val_losses"], rtol=2e-4, err_msg="val_losses")
    np.testing.assert_allclose(h2["train_accuracies"], h1["train_accuracies"], atol=2.5 / 288, rtol=0,
                               err_msg="train_accuracies")
    np.testing.assert_allclose(h2["val_accuracies"], h1["val_accuracies"], atol=1.5 / 96, rtol=0,
                               err_msg="val_accuracies")
    assert h1["effective_batch_size"] == h2["effective_batch_size"] == 32


# ------------------------------------------- fit == the loop by hand with DistributedSampler and DDP

REPLICA = PRELUDE + r'''
D.init()
N, B, DROP = int(os.environ["N"]), int(os.environ["B"]), os.environ["DROP_LAST"] == "1"
E, LR, SEED = 3, 0.05, 11
X, y = blobs(N, seed=4)
loss_fn = cx.CrossEntropyLoss()

model = build(seed=9)
trainer = D.DistributedTrainer(model, loss_fn, cx.SGDOptimizer(LR))
h = trainer.fit(X, y, config(epochs=E, batch_size=B, shuffle=True, seed=SEED, drop_last=DROP))

# The documented recipe: DistributedSampler(seed=config.seed, drop_last=config.drop_last),
# set_epoch(epoch) for epoch 0, 1, ..., batches of B consecutive local indices.
ref = build(seed=9)
ddp = D.DistributedDataParallel(ref)
opt = cx.SGDOptimizer(LR)
sampler = D.DistributedSampler(N, shuffle=True, seed=SEED, drop_last=DROP)
for epoch in range(E):
    sampler.set_epoch(epoch)
    idx = np.asarray(sampler.get_indices(), dtype=np.int64)
    for k in range(0, len(idx), B):
        b = idx[k:k + B]
        out = ddp.forward(X[b])
        ddp.backward(loss_fn.backward(out, y[b]))
        ddp.update_parameters(opt)

# and with the default seed (42): another order, so the comparison above can tell seeds apart
other = build(seed=9)
D.DistributedTrainer(other, loss_fn, cx.SGDOptimizer(LR)).fit(
    X, y, config(epochs=E, batch_size=B, shuffle=True, drop_last=DROP))
dump("replica", fit=params(model), by_hand=params(ref), default_seed=params(other), history=hist(h))
'''


@pytest.mark.parametrize("n, batch, drop_last", [
    (256, 16, False),   # 128 rows per rank: 8 full batches
    (261, 16, False),   # padded to 262 (one row twice): 8 full batches and one of 3 per rank
    (261, 13, True),    # the tail row dropped: 130 rows per rank, 10 full batches (with padding: 11)
], ids=["even", "padded", "drop_last"])
def test_fit_shards_with_distributed_sampler_seeded_by_config(ranks, n, batch, drop_last):
    run(ranks, REPLICA, 2, env={"N": n, "B": batch, "DROP_LAST": int(drop_last)})
    reports = outputs(ranks, "replica", 2)
    assert_same_histories(reports)
    for rep in reports:
        for a, b in zip(arrays(rep["by_hand"]), arrays(rep["fit"])):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6,
                                       err_msg="fit differs from DistributedSampler(seed=config.seed, "
                                               "drop_last=config.drop_last) + set_epoch(0..E-1) + DDP by hand")
        assert any(not np.allclose(a, b, rtol=1e-3, atol=1e-4)
                   for a, b in zip(arrays(rep["fit"]), arrays(rep["default_seed"]))), \
            "config.seed=11 and the default seed gave the same parameters"


# --------------------------------------------------------------------------------- validation_split

VALSPLIT = PRELUDE + r'''
D.init()
X, y = blobs(400, seed=6)          # validation_split 0.25: rows 300..399 are the validation set
loss_fn = cx.CrossEntropyLoss()

def train(*data, **kw):
    model = build(seed=2)
    trainer = D.DistributedTrainer(model, loss_fn, cx.AdamOptimizer(0.01))
    return trainer, model, trainer.fit(*data, config(epochs=3, batch_size=16, seed=5, **kw))

t1, m1, h1 = train(X, y, validation_split=0.25)
t2, m2, h2 = train(X[:300], y[:300], X[300:], y[300:])
ev = t1.evaluate(X[300:], y[300:])
m1.eval()
out = m1.forward(X[300:])
oracle = [float(loss_fn.forward(out, y[300:])), float(np.mean(np.argmax(out, axis=1) == y[300:]))]
dump("valsplit", split=hist(h1), explicit=hist(h2), split_params=params(m1), explicit_params=params(m2),
     evaluate=list(ev), oracle=oracle)
'''


def test_validation_split_holds_out_the_last_rows(ranks):
    run(ranks, VALSPLIT, 2)
    reports = outputs(ranks, "valsplit", 2)
    assert_same_on_every_rank(reports, "evaluate")
    assert_same_histories([{"history": rep["split"]} for rep in reports])
    assert_same_histories([{"history": rep["explicit"]} for rep in reports])
    rep = reports[0]
    s, e = rep["split"], rep["explicit"]
    assert len(s["val_losses"]) == len(s["val_accuracies"]) == 3, s
    assert len(e["val_losses"]) == len(e["val_accuracies"]) == 3, e
    for key in ("train_losses", "train_accuracies", "val_losses", "val_accuracies"):
        np.testing.assert_allclose(s[key], e[key], rtol=1e-6, atol=1e-7,
                                   err_msg=f"{key}: validation_split=0.25 vs fit(X[:300], y[:300], X[300:], y[300:])")
    for a, b in zip(arrays(rep["explicit_params"]), arrays(rep["split_params"])):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg="parameters: split vs explicit")
    # the last epoch's validation metrics are those of the final model on the held-out rows
    np.testing.assert_allclose([s["val_losses"][-1], rep["evaluate"][0]], rep["oracle"][0], rtol=1e-5)
    np.testing.assert_allclose([s["val_accuracies"][-1], rep["evaluate"][1]], rep["oracle"][1], atol=1e-6)


# ------------------------------------------------------ evaluate / predict: every sample exactly once

EVAL = PRELUDE + r'''
D.init()
X, y = blobs(203, seed=8)          # 203 = 3 * 67 + 2: a padded sampler would count two rows twice
model = build(seed=3, dropout=0.5)  # evaluate/predict must run in inference mode
loss_fn = cx.CrossEntropyLoss()
trainer = D.DistributedTrainer(model, loss_fn, cx.SGDOptimizer(0.01))
res = {}
res["evaluate16"] = list(trainer.evaluate(X, y, batch_size=16))
res["evaluate"] = list(trainer.evaluate(X, y))
res["predict16"] = trainer.predict(X, batch_size=16).tolist()
res["predict"] = trainer.predict(X).tolist()
res["evaluate_tiny"] = list(trainer.evaluate(X[:2], y[:2], batch_size=16))   # a rank with no rows
res["predict_tiny"] = trainer.predict(X[:2], batch_size=16).tolist()
model.eval()
ref = model.forward(X)
res["ref"] = ref.tolist()
res["ref_eval"] = [float(loss_fn.forward(ref, y)), float(np.mean(np.argmax(ref, axis=1) == y))]
res["ref_tiny"] = [float(loss_fn.forward(ref[:2], y[:2])), float(np.mean(np.argmax(ref[:2], axis=1) == y[:2]))]
dump("eval", **res)
'''


def test_evaluate_and_predict_count_every_sample_once(ranks):
    run(ranks, EVAL, 3)
    reports = outputs(ranks, "eval", 3)
    assert_same_on_every_rank(reports, "evaluate16", "evaluate", "predict16", "predict", "evaluate_tiny",
                              "predict_tiny")
    rep = reports[0]
    ref = np.asarray(rep["ref"], dtype=np.float32)
    loss, acc = rep["ref_eval"]
    for key in ("evaluate16", "evaluate"):
        np.testing.assert_allclose(rep[key][0], loss, rtol=1e-5, err_msg=f"{key} loss vs one process")
        np.testing.assert_allclose(rep[key][1], acc, rtol=0, atol=1e-9, err_msg=f"{key} accuracy vs one process")
    for key in ("predict16", "predict"):
        pred = np.asarray(rep[key], dtype=np.float32)
        assert pred.shape == (203, 4), f"{key}: shape {pred.shape}"
        np.testing.assert_allclose(pred, ref, rtol=1e-5, atol=1e-6, err_msg=f"{key} vs model.forward(X)")
    np.testing.assert_allclose(rep["evaluate_tiny"][0], rep["ref_tiny"][0], rtol=1e-5, err_msg="evaluate 2 rows")
    np.testing.assert_allclose(rep["evaluate_tiny"][1], rep["ref_tiny"][1], atol=1e-9, err_msg="evaluate 2 rows")
    tiny = np.asarray(rep["predict_tiny"], dtype=np.float32)
    assert tiny.shape == (2, 4)
    np.testing.assert_allclose(tiny, ref[:2], rtol=1e-5, atol=1e-6, err_msg="predict 2 rows on 3 ranks")


# ----------------------------------------------------------------------------- only rank 0 prints

PRINT = PRELUDE + r'''
D.init()
X, y = blobs(200, seed=1)
model = build(seed=0)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
trainer.fit(X, y, config(epochs=2, batch_size=16, verbose=os.environ["VERBOSE"] == "1", log_every_n_batches=1,
                         validation_split=0.2))
trainer.evaluate(X, y)
trainer.predict(X)
'''


@pytest.mark.parametrize("verbose", [True, False], ids=["verbose", "quiet"])
def test_only_rank_0_prints(ranks, verbose):
    results = run(ranks, PRINT, 2, env={"VERBOSE": int(verbose)})
    r0, r1 = sorted(results, key=lambda r: r.rank)
    assert r1.out.strip() == "" and r1.err.strip() == "", f"rank 1 printed:\n{r1.out}\n{r1.err}"
    text = r0.out + r0.err
    if verbose:
        assert re.search(r"(?i)epoch\D{0,4}0*1\b", text) and re.search(r"(?i)epoch\D{0,4}0*2\b", text), \
            f"rank 0 did not report epochs 1 and 2:\n{text}"
        assert "\r" not in text, f"progress bar (\\r) written to a pipe, not plain lines:\n{text!r}"
    else:
        assert text.strip() == "", f"verbose=False, yet rank 0 printed:\n{text}"


# ---------------------------------------------------------------------------- scale_learning_rate


def test_scale_learning_rate_rules():
    scale = cx.distributed.scale_learning_rate
    assert scale(0.001, 64, "linear", batch_size=64, world_size=4) == pytest.approx(0.004, rel=1e-12)
    assert scale(0.001, 64, "sqrt", batch_size=64, world_size=4) == pytest.approx(0.002, rel=1e-12)
    assert scale(0.001, 64, batch_size=64, world_size=4) == pytest.approx(0.004, rel=1e-12)  # linear by default
    assert scale(0.1, 256, "linear", batch_size=32, world_size=8) == pytest.approx(0.1, rel=1e-12)
    assert scale(0.1, 256, "sqrt", batch_size=32, world_size=2) == pytest.approx(0.05, rel=1e-12)
    assert scale(0.01, 32, "sqrt", batch_size=64, world_size=3) == pytest.approx(0.01 * math.sqrt(6), rel=1e-12)
    for rule in ("cubic", ""):
        with pytest.raises(ValueError):
            scale(0.001, 64, rule, batch_size=64, world_size=4)
    with pytest.raises(ValueError):
        scale(0.001, 0, "linear", batch_size=64, world_size=4)


SCALE = PRELUDE + r'''
D.init()
s = D.scale_learning_rate
dump("scale", linear=s(0.001, 64), sqrt=s(0.001, 64, "sqrt"), batch=s(0.001, 32, batch_size=64),
     world=s(0.001, 64, world_size=1))
'''


def test_scale_learning_rate_defaults_to_this_job(ranks):
    run(ranks, SCALE, 2)
    for rep in outputs(ranks, "scale", 2):
        assert rep["linear"] == pytest.approx(0.002, rel=1e-12)           # batch_size=base, world_size=2
        assert rep["sqrt"] == pytest.approx(0.001 * math.sqrt(2), rel=1e-12)
        assert rep["batch"] == pytest.approx(0.004, rel=1e-12)            # 64 * 2 / 32
        assert rep["world"] == pytest.approx(0.001, rel=1e-12)


# ------------------------------------------------------------------------------------ without init

NO_INIT = PRELUDE + r'''
model = build()
try:
    D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.SGDOptimizer(0.1))
    dump("noinit", cls=None)
except Exception as e:
    dump("noinit", cls=type(e).__name__, dist=isinstance(e, D.DistError), msg=str(e))
'''


def test_trainer_without_init_says_to_call_init(ranks):
    run(ranks, NO_INIT, 1, env=UNSET)
    [rep] = outputs(ranks, "noinit", 1)
    assert rep["cls"] is not None, "DistributedTrainer was created without cx.distributed.init()"
    assert rep["dist"], f"expected a DistError, got {rep['cls']}: {rep['msg']}"
    assert "init()" in rep["msg"], rep["msg"]


# ------------------------------------------------------------------ ranks holding different datasets

DIFFERENT_DATA = PRELUDE + r'''
D.init()
X, y = blobs(100 if RANK == 0 else 120, seed=0)
trainer = D.DistributedTrainer(build(), cx.CrossEntropyLoss(), cx.SGDOptimizer(0.1))
calls = {"fit": lambda: trainer.fit(X, y, config(epochs=1, batch_size=16)),
         "evaluate": lambda: trainer.evaluate(X, y), "predict": lambda: trainer.predict(X)}
for name, call in calls.items():
    t0 = time.monotonic()
    try:
        call()
        dump(name, cls=None)
    except Exception as e:
        dump(name, cls=type(e).__name__, msg=str(e), elapsed=time.monotonic() - t0)
'''


def test_different_datasets_on_the_ranks_fail_clearly_everywhere(ranks):
    """fit, evaluate and predict split the rows by number: a rank with other rows must be a clear
    error on every rank (not a silently wrong evaluation, not a collective mismatch), and not a hang."""
    run(ranks, DIFFERENT_DATA, 2)
    for name in ("fit", "evaluate", "predict"):
        for r, rep in enumerate(outputs(ranks, name, 2)):
            assert rep["cls"] == "ValueError", f"{name}, rank {r}: {rep}"
            assert f"DistributedTrainer.{name}" in rep["msg"], rep["msg"]
            assert "rank 0: 100 rows" in rep["msg"] and "rank 1: 120 rows" in rep["msg"], rep["msg"]
            assert rep["elapsed"] < 10, rep


# ------------------------------------------------------------------ a checkpoint that cannot be written

UNWRITABLE = PRELUDE + r'''
D.init()
X, y = blobs(64, seed=0)
blocker = HERE / "not_a_dir"
blocker.write_text("a file where the checkpoint directory should be")
trainer = D.DistributedTrainer(build(), cx.CrossEntropyLoss(), cx.SGDOptimizer(0.1))
try:
    trainer.fit(X, y, config(epochs=1, batch_size=16, checkpoint_every_n_epochs=1,
                             checkpoint_dir=str(blocker / "sub")))
    dump("unwritable", cls=None)
except Exception as e:
    dump("unwritable", cls=type(e).__name__, errno=getattr(e, "errno", None), msg=str(e))
'''


def test_unwritable_checkpoint_dir_raises_oserror_on_every_rank(ranks):
    run(ranks, UNWRITABLE, 2)
    for r, rep in enumerate(outputs(ranks, "unwritable", 2)):
        assert rep["cls"] in ("NotADirectoryError", "FileExistsError", "OSError"), f"rank {r}: {rep}"
        assert rep["errno"], f"rank {r}: the OSError carries no errno: {rep}"
        assert "rank 0 could not write" in rep["msg"] and "not_a_dir" in rep["msg"], rep["msg"]


# ---------------------------------------------------------------------------- cuda_graphs on the CPU

GRAPHS_ON_CPU = PRELUDE + r'''
D.init()
X, y = blobs(150, seed=4)
for graphs in (False, True):
    model = build(seed=2)
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    cfg = config(epochs=2, batch_size=16, verbose=False)
    assert cfg.cuda_graphs is False, "cuda_graphs must default to False"
    cfg.cuda_graphs = graphs
    h = trainer.fit(X, y, cfg)
    dump(f"graphs{int(graphs)}", losses=h.train_losses, accuracies=h.train_accuracies, digest=digest(model))
'''


def test_cuda_graphs_on_a_cpu_model_is_ignored_with_a_notice(ranks):
    """A CPU model has no graph to capture: fit says so once, per rank 0's stderr, and trains exactly
    as without the setting (the same digest of the final weights)."""
    results = run(ranks, GRAPHS_ON_CPU, 2)
    eager, graphed = outputs(ranks, "graphs0", 2), outputs(ranks, "graphs1", 2)
    for r in range(2):
        assert graphed[r] == eager[r], f"rank {r}: cuda_graphs=True on the CPU changed the training"
    notice = "cuda_graphs=True is ignored because the model is on the CPU"
    for r in results:
        assert r.err.count(notice) == 1, f"rank {r.rank} stderr:\n{r.err}"


# ---------------------------------------------------------------------------- TrainStep

TRAIN_STEP = PRELUDE + r'''
D.init()
X, y = blobs(150, seed=6)
batches = [(X[i:i + 32], y[i:i + 32]) for i in range(0, 150, 32)]   # the last one has 22 rows

# The oracle: the guide's hand-written loop.
model = build(seed=3)
ddp = D.DistributedDataParallel(model)
opt, loss_fn = cx.AdamOptimizer(0.01), cx.CrossEntropyLoss()
losses, correct = [], 0
for xb, yb in batches:
    out = ddp.forward(xb)
    losses.append(loss_fn.forward(out, yb) * len(xb))
    correct += int((np.argmax(out, axis=1) == yb).sum())
    ddp.backward(loss_fn.backward(out, yb))
    ddp.update_parameters(opt)
manual = dict(loss=sum(losses) / 150, accuracy=correct / 150, digest=digest(model))

model = build(seed=3)
ddp = D.DistributedDataParallel(model)
step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
assert math.isnan(step.loss()) and step.samples == 0 and not step.graphed
for xb, yb in batches:
    step(xb, yb)
stepped = dict(loss=step.loss(), accuracy=step.accuracy(), digest=digest(model), samples=step.samples)
step.reset()
assert step.samples == 0 and math.isnan(step.accuracy())
try:
    step(X[:8], np.full(8, 7))   # class 7 of 4
    bad = None
except ValueError as e:
    bad = str(e)
dump("step", manual=manual, stepped=stepped, bad=bad)
'''


def test_train_step_equals_the_hand_written_loop(ranks):
    """TrainStep on every batch (the last one shorter) ends where the guide's loop of ddp.forward,
    loss_fn.backward, ddp.backward and ddp.update_parameters ends, on 2 ranks: the same weights bit for
    bit, and loss()/accuracy() are the sample-weighted means of that loop's loss values and argmax hits."""
    run(ranks, "import math\n" + TRAIN_STEP, 2)
    for r, rep in enumerate(outputs(ranks, "step", 2)):
        manual, stepped = rep["manual"], rep["stepped"]
        assert stepped["digest"] == manual["digest"], f"rank {r}: TrainStep trained other weights"
        assert stepped["loss"] == pytest.approx(manual["loss"], rel=1e-12), f"rank {r}"
        assert stepped["accuracy"] == manual["accuracy"] and stepped["samples"] == 150, f"rank {r}"
        assert rep["bad"] and "TrainStep: target class 7 at row 0 is out of range for 4 classes" in rep["bad"], rep["bad"]
