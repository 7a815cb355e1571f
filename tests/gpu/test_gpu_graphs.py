"""DistributedTrainingConfig.cuda_graphs: each full batch's training step captured once into a CUDA
graph and replayed. The oracle is the same fit without graphs, on the same GPU, from the same seed:
the replayed kernels are the captured ones, fed the same data and the same per-step scalars (the
optimizer writes them to the device before each replay), so the histories and the final parameters
must agree to float32 rounding. The fits cover a last, shorter batch (run eagerly between replays),
several epochs (the running sums are cleared between them), validation data (evaluate between
replays), SGD with momentum and MSE. A log line at CYXWIZ_LOG_LEVEL=info proves the replays
happened; a notice says why graphs are ignored where the step cannot be captured (Dropout).

Under the tests' host emulator (tests/gpu/emulator) the capture is emulated strictly: a host copy
inside the capture, or memory allocated in it and not freed in it, fails the fit.

Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason()).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_support import DDP_PRELUDE, assert_same_digest, ddp_reports, requires_gpu, requires_two_gpus
from harness import rank_env

pytestmark = requires_gpu

SCRIPT = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
import pycyxwiz.distributed as D

case, graphs, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
D.init()
rng = np.random.RandomState(7)
X = rng.standard_normal((203, 20)).astype(np.float32)   # 203 = 6 x 32 + 11: a last batch of 11 rows
cx.manual_seed(11)
model = cx.SequentialModel()
model.add(cx.LinearModule(20, 32))
model.add(cx.ReLUModule())
if case == "dropout":
    model.add(cx.DropoutModule(0.2))
model.add(cx.LinearModule(32, 16))
model.add(cx.TanhModule())
model.add(cx.LinearModule(16, 4 if case != "mse" else 3))
model.to("cuda")
if case == "mse":
    y = rng.standard_normal((203, 3)).astype(np.float32)
    loss, opt = cx.MSELoss(), cx.SGDOptimizer(0.05, momentum=0.9)
else:
    y = rng.randint(0, 4, 203).astype(np.int64)
    loss, opt = cx.CrossEntropyLoss(), cx.AdamWOptimizer(0.01, weight_decay=0.01)
trainer = D.DistributedTrainer(model, loss, opt)
config = D.DistributedTrainingConfig()
config.epochs, config.batch_size, config.seed, config.verbose = 3, 32, 5, False
config.cuda_graphs = graphs
Xv, yv = X[:40], y[:40]
h = trainer.fit(X, y, Xv, yv, config)
json.dump({"train_loss": h.train_losses, "train_acc": h.train_accuracies, "val_loss": h.val_losses,
           "params": [p.tolist() for p in model.parameters()], "steps": opt.state_dict()["step"]}, open(out, "w"))
D.finalize()
'''


def fit(ranks, tmp_path: Path, case: str, graphs: bool, **env) -> tuple[dict, str]:
    """One fit in its own process, through the `ranks` fixture (which kills it at the end)."""
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{case}-{int(graphs)}.json"
    _, stderr = ranks.command([sys.executable, script, case, "1" if graphs else "0", out],
                              rank_env(CYXWIZ_LOG_LEVEL="info", **env), timeout=120)
    return json.loads(out.read_text()), stderr


@pytest.mark.parametrize("case", ["adamw-cross-entropy", "sgd-momentum-mse"])
def test_graphed_fit_matches_the_eager_fit(ranks, tmp_path, case):
    case = "mse" if case.endswith("mse") else "ce"
    eager, eager_log = fit(ranks, tmp_path, case, False)
    graphed, log = fit(ranks, tmp_path, case, True)
    # 3 epochs x 7 batches: per epoch 6 full batches (1 eager warm-up in the first epoch, then replays)
    # and 1 short batch run eagerly.
    captured = re.findall(r"CUDA graph: captured the training step", log)
    assert len(captured) == 1, f"expected one capture in the log, got {len(captured)}:\n{log[-3000:]}"
    assert "CUDA graph" not in eager_log
    replays = re.search(r"CUDA graph: replayed (\d+) steps", log)
    assert replays and int(replays.group(1)) == 3 * 6 - 1, f"replays: {log[-3000:]}"
    assert graphed["steps"] == eager["steps"] == 3 * 7
    for key in ("train_loss", "train_acc", "val_loss"):
        np.testing.assert_allclose(graphed[key], eager[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for i, (g, e) in enumerate(zip(graphed["params"], eager["params"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6, err_msg=f"parameter {i}")
    assert graphed["train_loss"][-1] < graphed["train_loss"][0], "the graphed fit did not learn"


def test_graphed_fit_with_dropout_draws_the_eager_masks(ranks, tmp_path):
    """Dropout's seed is drawn on the host before each replay, in the order an eager step draws it, and
    read by the captured kernel from device memory: the graphed fit must equal the eager one."""
    eager, _ = fit(ranks, tmp_path, "dropout", False)
    graphed, log = fit(ranks, tmp_path, "dropout", True)
    assert "captured the training step" in log, log[-3000:]
    for key in ("train_loss", "train_acc", "val_loss"):
        np.testing.assert_allclose(graphed[key], eager[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for i, (g, e) in enumerate(zip(graphed["params"], eager["params"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6, err_msg=f"parameter {i}")


EMULATOR = "emulat" in os.environ.get("CYXWIZ_CUDA_LIBRARY", "")


@pytest.mark.skipif(not EMULATOR, reason="needs the tests' CUDA emulator (CYXWIZ_CUDA_LIBRARY), which can refuse a "
                                         "capture on demand")
def test_a_refused_capture_falls_back_to_eager_steps_with_a_warning(ranks, tmp_path):
    """A runtime that refuses the captured graph (emulated: CYXWIZ_EMULATED_CAPTURE_FAIL=1) costs the
    speed-up, not the training: a warning names the error and the fit equals the eager one (the
    refused capture trained on nothing, so no batch is lost or trained twice)."""
    eager, _ = fit(ranks, tmp_path, "ce", False)
    fallback, log = fit(ranks, tmp_path, "ce", True, CYXWIZ_EMULATED_CAPTURE_FAIL=1)
    assert "CUDA graph: the training step could not be captured (cudaGraphInstantiate" in log, log[-3000:]
    assert "training without graphs" in log and "replayed" not in log
    assert fallback["steps"] == eager["steps"] == 3 * 7
    for key in ("train_loss", "train_acc", "val_loss"):
        np.testing.assert_allclose(fallback[key], eager[key], rtol=1e-6, atol=1e-7, err_msg=key)
    for i, (g, e) in enumerate(zip(fallback["params"], eager["params"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-6, atol=1e-7, err_msg=f"parameter {i}")


STEP_SCRIPT = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
import pycyxwiz.distributed as D

D.init()
rng = np.random.RandomState(9)
X = rng.standard_normal((10 * 16 + 5, 12)).astype(np.float32)
y = rng.randint(0, 3, len(X)).astype(np.int64)
y[rng.random_sample(len(y)) < 0.2] = -100  # ignored rows, a different count in each batch: counted on the device
result = {}
for graphs in (False, True):
    cx.manual_seed(4)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(12, 24))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(24, 3))
    model.to("cuda")
    ddp = D.DistributedDataParallel(model)
    step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.02), cuda_graphs=graphs)
    for epoch in range(2):
        step.reset()
        for i in range(0, len(X), 16):
            step(X[i:i + 16], y[i:i + 16])
    result[str(graphs)] = dict(graphed=step.graphed, replays=step.replays, loss=step.loss(), accuracy=step.accuracy(),
                               samples=step.samples, params=[p.tolist() for p in model.parameters()])
json.dump(result, open(sys.argv[1], "w"))
D.finalize()
'''


def test_train_step_with_cuda_graphs_matches_the_eager_step(ranks, tmp_path):
    """cx.distributed.TrainStep in a hand-written loop: 2 epochs of 10 full batches and a short one.
    With cuda_graphs the first batch is eager, the second captured and replayed, every later full
    batch replayed (2 x 10 - 1 replays); the short ones run eagerly. Same weights and metrics as the
    eager steps."""
    script, out = tmp_path / "step.py", tmp_path / "step.json"
    script.write_text(STEP_SCRIPT)
    ranks.command([sys.executable, script, out], rank_env(), timeout=120)
    result = json.loads(out.read_text())
    eager, graphed = result["False"], result["True"]
    assert not eager["graphed"] and eager["replays"] == 0
    assert graphed["graphed"] and graphed["replays"] == 2 * 10 - 1, graphed["replays"]
    assert graphed["samples"] == eager["samples"] == len(range(0, 165))
    np.testing.assert_allclose(graphed["loss"], eager["loss"], rtol=1e-5)
    assert graphed["accuracy"] == pytest.approx(eager["accuracy"], abs=1 / 165)
    for i, (g, e) in enumerate(zip(graphed["params"], eager["params"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6, err_msg=f"parameter {i}")


NCCL_FIT = DDP_PRELUDE + r'''
D.init()
expect(D.get_backend() == "nccl", f"backend {D.get_backend()}")
rng = np.random.RandomState(13)
X = rng.standard_normal((200, 20)).astype(np.float32)    # per rank 100 rows: 6 batches of 16 and one of 4
y = rng.randint(0, 4, 200).astype(np.int64)
result = {}
for graphs in (False, True):
    cx.manual_seed(21)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(20, 32))
    model.add(cx.ReLUModule())
    model.add(cx.DropoutModule(0.1))
    model.add(cx.LinearModule(32, 4))
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    config = D.DistributedTrainingConfig()
    config.epochs, config.batch_size, config.verbose, config.cuda_graphs = 2, 16, False, graphs
    h = trainer.fit(X, y, config)
    result[str(graphs)] = dict(params=[p.tolist() for p in model.parameters()], loss=h.train_losses)
expect(model.device == f"cuda:{D.get_local_rank()}", f"model on {model.device}")
for i, (g, e) in enumerate(zip(result["True"]["params"], result["False"]["params"])):
    close(f"parameter {i}: graphed vs eager", g, e, rtol=1e-5, atol=1e-6)
close("train losses: graphed vs eager", result["True"]["loss"], result["False"]["loss"], rtol=1e-5, atol=1e-6)
finish(digest=digest([np.asarray(p, np.float32) for p in result["True"]["params"]]))
'''


@requires_two_gpus
def test_graphed_fit_on_two_nccl_ranks_matches_the_eager_fit(ranks):
    """Two ranks on two GPUs with DISTRIBUTED_BACKEND=nccl: the captured step contains the gradient
    all-reduce (the collective as a graph edge), and each replay is awaited with the NCCL timeout. The
    graphed fit equals the eager one on each rank, and both ranks end with identical bits."""
    results = ranks.run(NCCL_FIT, 2, env={"DISTRIBUTED_BACKEND": "nccl", "CYXWIZ_LOG_LEVEL": "info"}, timeout=120)
    reports = ddp_reports(ranks, results, 2)
    assert_same_digest(reports)
    for r in results:
        assert "CUDA graph: captured the training step" in r.err and "CUDA graph: replayed 11 steps" in r.err, r.err
