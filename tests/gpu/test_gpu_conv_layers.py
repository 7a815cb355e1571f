"""The convolutional layers on a GPU: cuDNN's convolution and pooling, our batch-norm, activation and
residual-add kernels. The oracle is the CPU engine (itself held to torch by tests/test_conv_layers.py):
the same model from the same seed on the CPU and on the GPU, forward, backward, parameter gradients and
running statistics within float32 rounding; a few optimizer steps; a graphed training step against
the eager one; SyncBatchNorm over NCCL (2 ranks x 16 rows == 1 process x 32 rows).

Under the tests' host emulator (tests/gpu/emulator) cuDNN's calls are computed naively on the host, so
these tests check how the engine drives cuDNN (shapes, descriptors, accumulation, workspace, streams),
not cuDNN's algorithms. Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason()).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from gpu_support import assert_same_digest, ddp_reports, requires_gpu, requires_two_gpus, seq, twins
from gpu_support import close as close_to
from test_conv_ddp import CNN as CONV_DDP_PRELUDE
from harness import rank_env

import pycyxwiz as cx

pytestmark = requires_gpu

# Convolutions sum up to a few hundred products: float32 steps relative to the largest value.
CONV = dict(rtol=1e-4, atol=2e-5)


def close(got, want, what, tol=CONV):
    close_to(got, want, what, tol)


def block(cin, cout, stride):
    body = seq(cx.Conv2DModule(cin, cout, 3, stride=stride, padding=1, use_bias=False), cx.BatchNorm2DModule(cout),
               cx.ReLUModule(), cx.Conv2DModule(cout, cout, 3, padding=1, use_bias=False), cx.BatchNorm2DModule(cout))
    shortcut = None
    if stride != 1 or cin != cout:
        shortcut = seq(cx.Conv2DModule(cin, cout, 1, stride=stride, use_bias=False), cx.BatchNorm2DModule(cout))
    return cx.ResidualModule(body, shortcut)


# name: (layers, input shape)
CASES = {
    "conv": (lambda: [cx.Conv2DModule(3, 8, 3)], (4, 3, 9, 9)),
    "conv_stride_padding": (lambda: [cx.Conv2DModule(3, 8, 3, stride=2, padding=1)], (4, 3, 9, 9)),
    "conv_dilated_grouped": (lambda: [cx.Conv2DModule(4, 6, (3, 2), padding=(2, 1), dilation=2, groups=2,
                                                      use_bias=False)], (3, 4, 10, 7)),
    "conv_1x1_stride2": (lambda: [cx.Conv2DModule(5, 7, 1, stride=2)], (2, 5, 8, 8)),
    "conv_depthwise": (lambda: [cx.Conv2DModule(6, 6, 3, padding=1, groups=6)], (2, 6, 7, 7)),
    "maxpool": (lambda: [cx.MaxPool2DModule(2)], (3, 4, 8, 8)),
    "maxpool_overlapping_padded": (lambda: [cx.MaxPool2DModule(3, stride=2, padding=1)], (3, 4, 9, 9)),
    "avgpool_padded": (lambda: [cx.AvgPool2DModule(3, stride=2, padding=1)], (3, 4, 9, 9)),
    "avgpool": (lambda: [cx.AvgPool2DModule(2)], (3, 4, 8, 6)),
    "global_avgpool_flatten_linear": (lambda: [cx.GlobalAvgPool2DModule(), cx.LinearModule(4, 3)], (5, 4, 6, 6)),
    "flatten_linear": (lambda: [cx.FlattenModule(), cx.LinearModule(48, 5)], (5, 3, 4, 4)),
    "linear_gelu_on_sequences": (lambda: [cx.LinearModule(6, 8), cx.GELUModule(), cx.LinearModule(8, 3)], (4, 5, 6)),
    "batchnorm2d": (lambda: [cx.BatchNorm2DModule(4)], (6, 4, 5, 5)),
    "batchnorm1d_rows": (lambda: [cx.BatchNorm1DModule(7)], (16, 7)),
    "batchnorm1d_sequence": (lambda: [cx.BatchNorm1DModule(3, eps=1e-3, momentum=0.3)], (4, 3, 9)),
    "leaky_relu": (lambda: [cx.LeakyReLUModule(0.2)], (3, 4, 5, 5)),
    "elu": (lambda: [cx.ELUModule(0.7)], (3, 4, 5, 5)),
    "swish": (lambda: [cx.SwishModule()], (3, 4, 5, 5)),
    "mish": (lambda: [cx.MishModule()], (3, 4, 5, 5)),
    "residual_identity": (lambda: [block(4, 4, 1)], (3, 4, 6, 6)),
    "residual_projection": (lambda: [block(4, 8, 2)], (3, 4, 6, 6)),
    "small_resnet": (lambda: [cx.Conv2DModule(3, 8, 3, padding=1, use_bias=False), cx.BatchNorm2DModule(8),
                              cx.ReLUModule(), block(8, 8, 1), block(8, 16, 2), cx.GlobalAvgPool2DModule(),
                              cx.LinearModule(16, 10)], (4, 3, 8, 8)),
}


def images(shape, seed=1):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(np.float32)
    x.flat[:3] = [0.0, 25.0, -25.0]  # the activations' kink and saturation
    return x


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(CASES))
def test_layer_on_the_gpu_matches_the_cpu(name, training):
    layers, shape = CASES[name]
    cpu, gpu = twins(layers)
    if not training:
        # Eval normalises with running statistics: make them something other than 0 and 1 first.
        for m in (cpu, gpu):
            m.forward(images(shape, seed=7))
            m.eval()
    x = images(shape)
    out_c, out_g = cpu.forward(x), gpu.forward(x)
    assert isinstance(out_g, cx.Tensor) and out_g.device == "cuda:0", f"{name}: forward returned {out_g!r}"
    close(out_g, out_c, f"{name}: forward")
    g = np.random.default_rng(2).standard_normal(out_c.shape).astype(np.float32)
    cpu.zero_grad()
    gpu.zero_grad()
    dx_c, dx_g = cpu.backward(g, input_grad=True), gpu.backward(g, input_grad=True)
    close(dx_g, dx_c, f"{name}: input gradient")
    names = [n for n, _ in cpu.named_parameters()]
    for pname, a, b in zip(names, cpu.gradients(), gpu.gradients()):
        close(b, a, f"{name}: gradient of {pname}")
    # A second backward accumulates on the GPU as on the CPU.
    cpu.backward(g)
    gpu.backward(g)
    for i, (a, b) in enumerate(zip(cpu.gradients(), gpu.gradients())):
        close(b, a, f"{name}: accumulated gradient {i}")
    names_c = [n for n, _ in cpu.named_buffers()]
    assert names_c == [n for n, _ in gpu.named_buffers()]
    for n, a, b in zip(names_c, cpu.buffers(), gpu.buffers()):
        close(np.asarray(b, np.float64), np.asarray(a, np.float64), f"{name}: buffer {n}")


def test_a_cnn_trains_on_the_gpu_as_on_the_cpu(tmp_path):
    """Five Adam steps of the small ResNet on both devices: parameters and running statistics agree,
    and a model file written from the GPU loads on the CPU with the same outputs."""
    layers, shape = CASES["small_resnet"]
    cpu, gpu = twins(layers, seed=3)
    loss = cx.CrossEntropyLoss()
    opts = cx.AdamOptimizer(0.01), cx.AdamOptimizer(0.01)
    rng = np.random.default_rng(4)
    for step in range(5):
        x = images((8,) + shape[1:], seed=10 + step)
        y = rng.integers(0, 10, 8).astype(np.int64)
        for model, opt in zip((cpu, gpu), opts):
            out = model.forward(x)
            model.zero_grad()
            model.backward(loss.backward(out, y))
            opt.step(model)
    for i, (a, b) in enumerate(zip(cpu.parameters(), gpu.parameters())):
        close(b, a, f"parameter {i} after 5 steps", dict(rtol=1e-3, atol=1e-4))
    for i, (a, b) in enumerate(zip(cpu.buffers(), gpu.buffers())):
        close(np.asarray(b, np.float64), np.asarray(a, np.float64), f"buffer {i} after 5 steps", dict(rtol=1e-3, atol=1e-4))
    path = tmp_path / "resnet.cyxmodel"
    gpu.eval()
    gpu.save(str(path))
    back = cx.SequentialModel.load(str(path))
    back.eval()
    x = images(shape, seed=99)
    close(back.forward(x), gpu.forward(x), "a GPU model saved and loaded on the CPU")


def test_conv_under_autocast_on_the_gpu_rounds_its_operands():
    """autocast("bfloat16"): the convolution multiplies bfloat16-rounded input and weight and sums in
    float32, on the GPU as on the CPU (whose kernel may differ: a bfloat16 tolerance)."""
    cpu, gpu = twins(lambda: [cx.Conv2DModule(3, 8, 3, padding=1), cx.ReLUModule()])
    x = images((4, 3, 8, 8))
    with cx.autocast("bfloat16"):
        out_g = gpu.forward(x)
    out_c = cpu.forward(x)
    # bfloat16 operands: well away from float32's result, close to the CPU's rounded computation.
    diff = np.abs(np.asarray(out_g) - np.asarray(out_c)).max()
    assert 1e-4 < diff < 0.1, f"autocast conv on the GPU differs from float32 by {diff}"
    with cx.autocast("bfloat16"):
        want = cpu.forward(x)
    close(out_g, want, "bfloat16 conv, GPU vs CPU", dict(rtol=1e-2, atol=1e-2))


STEP_SCRIPT = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
import pycyxwiz.distributed as D

D.init()
rng = np.random.RandomState(9)
X = rng.standard_normal((6 * 8 + 3, 3, 8, 8)).astype(np.float32)
y = rng.randint(0, 4, len(X)).astype(np.int64)
result = {}
for graphs in (False, True):
    cx.manual_seed(4)
    model = cx.SequentialModel()
    for layer in (cx.Conv2DModule(3, 8, 3, padding=1, use_bias=False), cx.BatchNorm2DModule(8), cx.ReLUModule(),
                  cx.MaxPool2DModule(2), cx.Conv2DModule(8, 8, 3, padding=1), cx.SwishModule(),
                  cx.GlobalAvgPool2DModule(), cx.LinearModule(8, 4)):
        model.add(layer)
    model.to("cuda")
    ddp = D.DistributedDataParallel(model)
    step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.02), cuda_graphs=graphs)
    for epoch in range(2):
        step.reset()
        for i in range(0, len(X), 8):
            step(X[i:i + 8], y[i:i + 8])
    result[str(graphs)] = dict(graphed=step.graphed, replays=step.replays, loss=step.loss(),
                               params=[p.tolist() for p in model.parameters()],
                               buffers=[np.asarray(b, np.float64).tolist() for b in model.buffers()])
json.dump(result, open(sys.argv[1], "w"))
D.finalize()
'''


def test_graphed_cnn_step_matches_the_eager_step(ranks, tmp_path):
    """The training step of a CNN (cuDNN calls with their workspaces, batch norm updating its running
    statistics) captured into a CUDA graph and replayed: the same weights and statistics as eager steps."""
    script, out = tmp_path / "step.py", tmp_path / "step.json"
    script.write_text(STEP_SCRIPT)
    ranks.command([sys.executable, str(script), str(out)], rank_env(), timeout=120)
    result = json.loads(out.read_text())
    eager, graphed = result["False"], result["True"]
    assert graphed["graphed"] and graphed["replays"] == 2 * 6 - 1, graphed
    assert not eager["graphed"]
    np.testing.assert_allclose(graphed["loss"], eager["loss"], rtol=1e-5)
    for i, (g, e) in enumerate(zip(graphed["params"] + graphed["buffers"], eager["params"] + eager["buffers"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6, err_msg=f"state {i}")


# test_conv_ddp's CNN, batches and state (the CPU backend's SyncBatchNorm test), over NCCL here.
SYNC_BN = CONV_DDP_PRELUDE + r'''
STEPS, N = 3, 32
B = N // WS
sync = os.environ["TEST_SYNC"] == "1"
D.init()
model = cnn()
if sync:
    D.convert_sync_batchnorm(model)
ddp = D.DistributedDataParallel(model)   # NCCL: moves the model to cuda:LOCAL_RANK
expect(model.device == f"cuda:{D.get_local_rank()}", f"model on {model.device}")
opt = cx.SGDOptimizer(0.1, momentum=0.9)
for step in range(STEPS):
    X, y = images(step, N)
    out = ddp.forward(shard(X, B))
    ddp.backward(LOSS.backward(out, shard(y, B)))
    ddp.update_parameters(opt)
one = cnn().to(model.device)
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


@requires_two_gpus
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "control"])
def test_sync_batchnorm_over_nccl_two_ranks_equal_one_process(ranks, sync):
    """The per-channel sums travel by NCCL on the device: 2 ranks x 16 == 1 x 32 on one GPU (1e-5 of
    the largest value), buffers and parameters bit-identical on the ranks; without SyncBatchNorm the
    same run misses the oracle (the control that shows the test can fail)."""
    results = ranks.run(SYNC_BN, 2, env={"TEST_SYNC": "1" if sync else "0", "DISTRIBUTED_BACKEND": "nccl"}, timeout=120)
    reports = ddp_reports(ranks, results, 2)
    worst = max(rep["worst"] for rep in reports)
    if sync:
        assert worst <= 1e-5, f"2 ranks x 16 with SyncBatchNorm differ from 1 x 32 by {worst:.3g} of the largest value"
        assert_same_digest(reports)
    else:
        assert worst > 1e-3, f"without SyncBatchNorm the ranks still matched the oracle ({worst:.3g})"
