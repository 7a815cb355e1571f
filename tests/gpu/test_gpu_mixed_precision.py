"""Mixed precision on the GPU: cx.autocast and cx.GradScaler with the model on a GPU.

Oracles:
  * the CPU autocast path (nn/linear16.cpp) on the same weights and inputs. Both round the same
    float32 values to 16 bits with the same rounding (the GPU's cast kernel is bit for bit the
    host's), and multiply the 16-bit values with float32 accumulation; they differ only in the order
    of the float32 additions (cuBLASLt's tiles, or the emulator's loop, against OpenBLAS's blocks):
    a few float32 ulps of sum |a||b|, hence rtol 1e-5 against the magnitudes. A difference in the last
    float32 bit of a hidden activation can move its 16-bit rounding by one 16-bit ulp when it lies on
    a tie; that bounds the MLP's comparison (below);
  * numpy in float64 on the 16-bit-rounded operands (tests/test_mixed_precision.py's helpers), within
    the float32 accumulation bound, and not equal to the product of the unrounded operands;
  * a float32 GPU run of the same training: the autocast run's loss stays within a few percent;
  * the CPU GradScaler on a CPU twin: the same skipped steps and the same scale sequence, with a
    planted overflow (a loss gradient times 1e30: Inf once rounded to float16 in backward);
  * the eager TrainStep for the graphed one under autocast (same kernels, same scalars);
  * 2 NCCL ranks (CYXWIZ_EMULATED_GPUS=2 under the emulator): bf16 autocast DDP (graphed) ends with
    the same bits on both ranks, and an fp16 overflow planted on one rank skips the step on both.

Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason()); the two-rank case needs two.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from gpu_support import DDP_PRELUDE, assert_same_digest, ddp_reports, requires_gpu, requires_two_gpus
from harness import rank_env
from test_mixed_precision import assert_float32_accumulation, assert_not_float32, numpy_mlp_step, round16

import pycyxwiz as cx

pytestmark = requires_gpu

DTYPES = ["bfloat16", "float16"]


def mlp(seed=3, sizes=(24, 40, 7)):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(sizes[0], sizes[1]))
    m.add(cx.ReLUModule())
    m.add(cx.LinearModule(sizes[1], sizes[2]))
    return m


def twins(seed=3, sizes=(24, 40, 7)):
    cpu, gpu = mlp(seed, sizes), mlp(seed, sizes).to("cuda")
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert np.array_equal(p, q)
    return cpu, gpu


def close_to(got, want, what, rtol=1e-5):
    """|got - want| <= rtol * max|want| (+ a float32 ulp of it): float32 accumulation order only."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got - want).max()
    assert err <= rtol * scale, f"{what}: max difference {err:.3g}, {err / scale:.3g} of the largest magnitude"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_linear_matches_numpy_on_rounded_operands(dtype):
    cx.manual_seed(1)
    lin = cx.LinearModule(48, 20)
    params = [np.array(p, copy=True) for p in lin.parameters()]
    lin_gpu = cx.SequentialModel()
    lin_gpu.add(lin)
    lin_gpu.to("cuda")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 48)).astype(np.float32)
    g = (rng.standard_normal((12, 20)) * 1e-2).astype(np.float32)
    with cx.autocast(dtype):
        y = lin_gpu.forward(x)
    saved = lin_gpu[0]._saved_tensors()
    assert [t["dtype"] for t in saved] == [dtype, dtype], f"a GPU autocast Linear keeps {saved}"
    dx = lin_gpu.backward(g, input_grad=True)  # outside autocast: follows what forward did
    assert y.is_cuda and dx.is_cuda
    y, dx = np.asarray(y), np.asarray(dx)
    w, b = params
    x16, w16, g16 = round16(x, dtype), round16(w, dtype), round16(g, dtype)
    assert_float32_accumulation(y - b, x16, w16.T, "forward")
    assert_not_float32(y - b, x, w.T, "forward used the float32 operands")
    dw, db = lin_gpu.gradients()
    assert_float32_accumulation(dw, g16.T, x16, "weight gradient")
    np.testing.assert_allclose(db, g16.astype(np.float64).sum(0), rtol=1e-5, atol=1e-6)
    assert_float32_accumulation(dx, g16, w16, "input gradient")
    assert_not_float32(dx, g, w, "input gradient used the float32 operands")
    assert all(p.dtype == np.float32 and np.array_equal(p, q) for p, q in zip(lin_gpu.parameters(), params)), \
        "the master weights changed or are not float32"
    assert all(t["shape"] != (20, 48) for t in lin_gpu[0]._saved_tensors()), "backward kept the 16-bit weight"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_autocast_forward_backward_match_the_cpu_autocast(dtype):
    """Linear -> ReLU (fused) -> Linear: outputs and gradients against the CPU autocast path and numpy."""
    cpu, gpu = twins()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 24)).astype(np.float32)
    y = rng.integers(0, 7, 16)
    loss = cx.CrossEntropyLoss()
    with cx.autocast(dtype):
        out_c = cpu.forward(x)
        out_g = gpu.forward(x)
    assert out_g.is_cuda
    saved = [t["dtype"] for i in range(len(gpu)) for t in gpu[i]._saved_tensors()]
    assert saved and all(d == dtype for d in saved), f"the GPU model keeps {saved} for backward"
    close_to(out_g, out_c, "output")
    g = loss.backward(out_c, y)           # one loss gradient for both: backward compared alone
    cpu.backward(g)
    gpu.backward(g)
    for i, (a, b) in enumerate(zip(gpu.gradients(), cpu.gradients())):
        close_to(a, b, f"gradient {i}", rtol=1e-4 if i < 2 else 1e-5)  # layer 0 sees dh's 16-bit rounding
    # numpy sums the hidden activation in float64, the engines in float32: where it lies on a 16-bit
    # rounding tie the two roundings differ by one 16-bit ulp, which moves an output by up to
    # ulp16(h) |w2| (2^-10 x 0.16 for float16): 1e-3 of the largest value bounds that.
    want_out, want_grads = numpy_mlp_step(x, g, cpu.parameters(), dtype)
    close_to(out_g, want_out, "output against numpy", rtol=1e-3)
    for i, (got, want) in enumerate(zip(gpu.gradients(), want_grads)):
        close_to(got, want, f"gradient {i} against numpy", rtol=1e-3)
    out32 = np.asarray(mlp().to("cuda").forward(x))
    assert not np.allclose(np.asarray(out_g), out32, rtol=1e-6, atol=1e-7), "autocast gave the float32 output"


def train(model, dtype, steps=40, scaler=None):
    """A small classification task; the mean loss of the last 5 steps."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((256, 24)).astype(np.float32)
    y = (X[:, :7] @ rng.standard_normal(7)).argsort().argsort() * 7 // 256
    opt, loss, losses = cx.AdamOptimizer(0.01), cx.CrossEntropyLoss(), []
    for s in range(steps):
        i = (s * 32) % 256
        xb, yb = X[i:i + 32], y[i:i + 32]
        with cx.autocast(dtype or "bfloat16", enabled=dtype is not None):
            out = model.forward(xb)
        losses.append(float(loss.forward(out, yb)))
        model.zero_grad()
        g = loss.backward(out, yb)
        if scaler is None:
            model.backward(g)
            opt.step(model)
        else:
            model.backward(scaler.scale(g))
            scaler.step(opt, model)
            scaler.update()
    return float(np.mean(losses[-5:])), float(np.mean(losses[:5]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_training_under_autocast_tracks_float32(dtype):
    f32_last, f32_first = train(mlp().to("cuda"), None)
    scaler = cx.GradScaler(init_scale=2.0 ** 12) if dtype == "float16" else None
    last, _ = train(mlp().to("cuda"), dtype, scaler=scaler)
    assert f32_last < 0.8 * f32_first, f"float32 did not learn: {f32_first:.4f} -> {f32_last:.4f}"
    assert abs(last - f32_last) <= 0.05 * f32_last, f"{dtype}: loss {last:.5f}, float32 {f32_last:.5f}"


def test_grad_scaler_on_gpu_gradients_matches_the_cpu_grad_scaler():
    cpu, gpu = twins(seed=5, sizes=(8, 16, 3))
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)
    loss = cx.CrossEntropyLoss()
    opts = {"cpu": cx.SGDOptimizer(0.1), "gpu": cx.SGDOptimizer(0.1)}
    scalers = {k: cx.GradScaler(init_scale=2.0 ** 10, growth_interval=2) for k in opts}
    boosts = [1.0, 1.0, 1e30, 1.0, 1.0, 1.0, 1e30, 1.0]   # a planted overflow at steps 2 and 6
    seen = {"cpu": [], "gpu": []}
    for step, boost in enumerate(boosts):
        for name, m in (("cpu", cpu), ("gpu", gpu)):
            before = [np.array(p, copy=True) for p in m.parameters()]
            with cx.autocast("float16"):
                out = m.forward(x)
            m.zero_grad()
            g = np.asarray(loss.backward(out, y)) * np.float32(boost)
            m.backward(scalers[name].scale(g))
            stepped = scalers[name].step(opts[name], m)
            scalers[name].update()
            seen[name].append((stepped, scalers[name].get_scale()))
            if not stepped:
                assert all(np.array_equal(p, q) for p, q in zip(m.parameters(), before)), \
                    f"{name}: the skipped step {step} changed the parameters"
    assert seen["gpu"] == seen["cpu"], f"GPU (stepped, scale) {seen['gpu']}\nCPU {seen['cpu']}"
    assert [s for s, _ in seen["gpu"]] == [b == 1.0 for b in boosts]
    assert seen["gpu"][2][1] == seen["gpu"][1][1] / 2, "no back-off after the overflow"
    assert opts["gpu"].step_count == 6
    for i, (p, q) in enumerate(zip(gpu.parameters(), cpu.parameters())):
        assert np.isfinite(p).all()
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5, err_msg=f"parameter {i}")


def test_grad_scaler_scale_keeps_a_gpu_gradient_on_the_gpu():
    s = cx.GradScaler(init_scale=1024.0)
    g = cx.Tensor(np.array([[0.5, -0.25, 3.0]], np.float32)).to("cuda")
    out = s.scale(g)
    assert out.is_cuda
    np.testing.assert_array_equal(np.asarray(out), np.asarray(g) * np.float32(1024))


GRAPHED = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
import pycyxwiz.distributed as D

D.init()
rng = np.random.RandomState(9)
X = rng.standard_normal((6 * 16 + 5, 12)).astype(np.float32)
y = rng.randint(0, 3, len(X)).astype(np.int64)
result = {}
for name, graphs, mixed in (("float32", False, None), ("eager", False, "bf16"), ("graphed", True, "bf16")):
    cx.manual_seed(4)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(12, 24))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(24, 3))
    model.to("cuda")
    ddp = D.DistributedDataParallel(model)
    step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.02), cuda_graphs=graphs, mixed_precision=mixed)
    for i in range(0, len(X), 16):
        step(X[i:i + 16], y[i:i + 16])
    result[name] = dict(graphed=step.graphed, replays=step.replays, loss=step.loss(),
                        params=[p.tolist() for p in model.parameters()])
json.dump(result, open(sys.argv[1], "w"))
D.finalize()
'''


def test_graphed_step_under_autocast_equals_the_eager_step(ranks, tmp_path):
    script, out = tmp_path / "step.py", tmp_path / "step.json"
    script.write_text(GRAPHED)
    ranks.command([sys.executable, script, out], rank_env(), timeout=120)
    result = json.loads(out.read_text())
    f32, eager, graphed = result["float32"], result["eager"], result["graphed"]
    assert graphed["graphed"] and graphed["replays"] == 6 - 1, (graphed["graphed"], graphed["replays"])
    np.testing.assert_allclose(graphed["loss"], eager["loss"], rtol=1e-6)
    for i, (g, e) in enumerate(zip(graphed["params"], eager["params"])):
        np.testing.assert_array_equal(np.array(g), np.array(e), err_msg=f"parameter {i}: graphed vs eager")
    assert any(not np.array_equal(np.array(e), np.array(f)) for e, f in zip(eager["params"], f32["params"])), \
        "the bf16 steps trained bit-identically to float32: was autocast applied?"


def test_fp16_train_step_drops_the_graph_with_a_notice(ranks, tmp_path):
    script, out = tmp_path / "step.py", tmp_path / "step.json"
    script.write_text(GRAPHED.replace('("graphed", True, "bf16")', '("graphed", True, "fp16")'))
    _, err = ranks.command([sys.executable, script, out], rank_env(), timeout=120)
    result = json.loads(out.read_text())
    assert not result["graphed"]["graphed"] and result["graphed"]["replays"] == 0
    assert "cuda_graphs=True is ignored with a GradScaler" in err and "mixed_precision='bf16'" in err, err[-2000:]


TWO_RANKS = DDP_PRELUDE + r'''
D.init()
expect(D.get_backend() == "nccl", f"backend {D.get_backend()}")
rng = np.random.RandomState(13)
X = rng.standard_normal((2 * (4 * 16), 20)).astype(np.float32)
y = rng.randint(0, 5, len(X)).astype(np.int64)
mine = slice(RANK * (len(X) // 2), (RANK + 1) * (len(X) // 2))
Xr, yr = X[mine], y[mine]
ddp = D.DistributedDataParallel(build(0, hidden=64, extra=True))
step = D.TrainStep(ddp, LOSS, cx.AdamOptimizer(0.01), cuda_graphs=True, mixed_precision="bf16")
for epoch in range(2):
    for i in range(0, len(Xr), 16):
        step(Xr[i:i + 16], yr[i:i + 16])
expect(step.graphed and step.replays == 2 * 4 - 1, f"graphed {step.graphed}, {step.replays} replays")
bf16_params = copies(ddp.parameters())

# fp16 with a GradScaler over the averaged GPU gradients: an overflow planted on rank 0 only skips
# the step on both ranks (the verdict is agreed), and the scale backs off on both.
ddp = D.DistributedDataParallel(build(1, hidden=64, extra=True))
scaler, opt, stepped = cx.GradScaler(init_scale=2.0 ** 10), cx.SGDOptimizer(0.05), []
for s in range(3):
    with cx.autocast("float16"):
        out = ddp.forward(Xr[s * 16:(s + 1) * 16])
    g = np.asarray(LOSS.backward(out, yr[s * 16:(s + 1) * 16]))
    if s == 1 and RANK == 0:
        g = g * np.float32(1e30)
    ddp.backward(scaler.scale(g))
    stepped.append(scaler.step(opt, ddp))
    scaler.update()
expect(stepped == [True, False, True], f"stepped {stepped}")
expect(scaler.get_scale() == 2.0 ** 9, f"scale {scaler.get_scale()}")
finish(digest=digest(bf16_params), fp16=digest(ddp.parameters()))
'''


@requires_two_gpus
def test_two_nccl_ranks_under_autocast_end_bit_identical(ranks):
    results = ranks.run(TWO_RANKS, 2, env={"DISTRIBUTED_BACKEND": "nccl"}, timeout=120)
    reports = ddp_reports(ranks, results, 2)
    assert_same_digest(reports)
    assert_same_digest(reports, key="fp16")
