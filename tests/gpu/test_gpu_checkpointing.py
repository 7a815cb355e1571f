"""Gradient checkpointing on a GPU model: DistributedTrainer.fit over a model with
set_gradient_checkpointing, eager and with cuda_graphs.

The oracle is the same fit without checkpointing, on the same GPU, from the same seed. Eager, a
checkpointed fit replays the same kernels on the same inputs, and GPU Dropout reseeds its counter-based
stream from the same draw of the global generator (restored for the replay), so the parameters must be
equal bit for bit. Captured into a CUDA graph, the recomputed forward reads Dropout's seed from the
same device buffer as the first, and what it allocates it frees inside the capture (the emulator fails
the fit otherwise); the graphed fit is held to the tolerance of tests/gpu/test_gpu_graphs.py.

Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason()).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_support import requires_gpu
from harness import rank_env

pytestmark = requires_gpu

SCRIPT = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
import pycyxwiz.distributed as D

segments, graphs, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
D.init()
rng = np.random.RandomState(7)
X = rng.standard_normal((203, 20)).astype(np.float32)
y = rng.randint(0, 4, 203).astype(np.int64)
cx.manual_seed(11)
model = cx.SequentialModel()
for layer in (cx.LinearModule(20, 32), cx.ReLUModule(), cx.DropoutModule(0.2), cx.LinearModule(32, 32),
              cx.TanhModule(), cx.LinearModule(32, 16), cx.ReLUModule(), cx.LinearModule(16, 4)):
    model.add(layer)
model.to("cuda")
model.set_gradient_checkpointing(segments)
opt = cx.AdamOptimizer(0.01)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), opt)
config = D.DistributedTrainingConfig()
config.epochs, config.batch_size, config.seed, config.verbose = 3, 32, 5, False
config.cuda_graphs = graphs
h = trainer.fit(X, y, config)
json.dump({"train_loss": h.train_losses, "params": [np.asarray(p).tolist() for p in model.parameters()],
           "rng": cx.get_rng_state().hex()}, open(out, "w"))
D.finalize()
'''


def fit(ranks, tmp_path: Path, segments: int, graphs: bool) -> tuple[dict, str]:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{segments}-{int(graphs)}.json"
    _, stderr = ranks.command([sys.executable, script, segments, "1" if graphs else "0", out],
                              rank_env(CYXWIZ_LOG_LEVEL="info"), timeout=120)
    return json.loads(out.read_text()), stderr


def test_checkpointed_fit_is_bit_identical(ranks, tmp_path):
    plain, _ = fit(ranks, tmp_path, 0, False)
    for segments in (2, 3):
        got, _ = fit(ranks, tmp_path, segments, False)
        assert got["train_loss"] == plain["train_loss"], f"segments={segments}"
        for i, (g, p) in enumerate(zip(got["params"], plain["params"])):
            assert np.array_equal(np.array(g), np.array(p)), f"segments={segments}: parameter {i} differs"
        assert got["rng"] == plain["rng"], f"segments={segments}: the random stream ends elsewhere"


def test_checkpointed_graphed_fit_matches_the_plain_eager_fit(ranks, tmp_path):
    eager, _ = fit(ranks, tmp_path, 0, False)
    graphed, log = fit(ranks, tmp_path, 3, True)
    assert "CUDA graph: captured the training step" in log, log[-3000:]
    assert "replayed" in log and "could not be captured" not in log, log[-3000:]
    np.testing.assert_allclose(graphed["train_loss"], eager["train_loss"], rtol=1e-5, atol=1e-6)
    for i, (g, e) in enumerate(zip(graphed["params"], eager["params"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6, err_msg=f"parameter {i}")
