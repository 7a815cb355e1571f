"""Every layer, loss and optimizer on the GPU against the CPU engine (the oracle): the same model built
twice from one cx.manual_seed, one copy moved with model.to("cuda"), fed the same numpy arrays.

Tolerances (float32, TF32 off):
  * elementwise layers, losses, optimizer updates: rtol 1e-5, atol 1e-5 (a few ulps of float32; erf,
    exp and tanh of the CUDA math library are within 2 ulps of the C library's);
  * matrix products (Linear 784x256, batch 64): rtol 1e-4, atol 1e-5 (cuBLAS and OpenBLAS sum the 784
    products in other orders: a relative error of about sqrt(784) * 2**-24 of the terms' magnitude);
  * the loss gradient is O(1/batch): rtol 1e-5, atol 1e-6;
  * parameters after 5 optimizer steps: within 1e-5 absolute;
  * TF32 on (10-bit mantissa): the matrix product within 1e-2 relative (in the Frobenius norm).
Dropout draws its GPU masks from another stream than the CPU's, so p > 0 is checked by its
properties: mask values 0 or 1/keep, the kept fraction, backward = grad * mask.

Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason()).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gpu_support import GPU_COUNT, requires_gpu

import pycyxwiz as cx

pytestmark = requires_gpu

ELEMENTWISE = dict(rtol=1e-5, atol=1e-5)
GEMM = dict(rtol=1e-4, atol=1e-5)
LOSS_GRAD = dict(rtol=1e-5, atol=1e-6)


def close(got, want, what, tol):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    # atol scales with the largest value: a sum of products near 200 carries float32 steps of ~1.5e-5.
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got, want, err_msg=what, rtol=tol["rtol"], atol=tol["atol"] * scale)


def is_gpu_tensor(x) -> bool:
    return isinstance(x, cx.Tensor) and x.is_cuda and x.device == "cuda:0"


def twins(make, seed=0):
    """(cpu_model, gpu_model): built from the same seed; the second moved to the GPU."""
    cx.manual_seed(seed)
    cpu = make()
    cx.manual_seed(seed)
    gpu = make()
    assert gpu.to("cuda") is gpu, "model.to must return the model"
    assert gpu.device == "cuda:0" and cpu.device == "cpu"
    for i, (p, q) in enumerate(zip(cpu.parameters(), gpu.parameters())):
        assert isinstance(q, np.ndarray), f"parameters() of a GPU model: {type(q).__name__}, expected a host copy"
        assert np.array_equal(p, q), f"parameter {i} changed on its way to the GPU"
    return cpu, gpu


def sequential(*layers):
    def make():
        m = cx.SequentialModel()
        for layer in layers:
            m.add(layer())
        return m
    return make


def inputs(n, features, seed=1):
    """Standard normal rows, with the awkward values: exact zeros (ReLU's kink), saturating and large
    magnitudes (sigmoid/tanh/softmax stability)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    x[0, :min(5, features)] = 0.0
    x[1, :min(3, features)] = [20.0, -20.0, 50.0][:min(3, features)]
    x[2, :] += 80.0
    return x


# ---- layers -------------------------------------------------------------------------------------

LAYERS = {
    "linear": (sequential(lambda: cx.LinearModule(784, 256)), 784, GEMM, True),
    "linear_no_bias": (sequential(lambda: cx.LinearModule(784, 256, bias=False)), 784, GEMM, True),
    "relu": (sequential(cx.ReLUModule), 37, ELEMENTWISE, True),
    "gelu": (sequential(cx.GELUModule), 37, ELEMENTWISE, True),
    "sigmoid": (sequential(cx.SigmoidModule), 37, ELEMENTWISE, True),
    "tanh": (sequential(cx.TanhModule), 37, ELEMENTWISE, True),
    "softmax": (sequential(cx.SoftmaxModule), 37, ELEMENTWISE, True),
    "dropout_p0": (sequential(lambda: cx.DropoutModule(0.0)), 37, ELEMENTWISE, True),
    "dropout_eval": (sequential(lambda: cx.DropoutModule(0.5)), 37, ELEMENTWISE, False),
    "mlp": (sequential(lambda: cx.LinearModule(784, 256), cx.ReLUModule, lambda: cx.LinearModule(256, 10)),
            784, GEMM, True),
    "every_activation": (sequential(lambda: cx.LinearModule(64, 48), cx.GELUModule, lambda: cx.LinearModule(48, 32),
                                    cx.TanhModule, lambda: cx.LinearModule(32, 16), cx.SigmoidModule,
                                    lambda: cx.DropoutModule(0.0), lambda: cx.LinearModule(16, 8), cx.ReLUModule,
                                    cx.SoftmaxModule),
                         64, GEMM, True),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_and_backward_match_the_cpu(name):
    make, features, tol, training = LAYERS[name]
    cpu, gpu = twins(make)
    if not training:
        cpu.eval()
        gpu.eval()
    x = inputs(64, features)
    out_c = cpu.forward(x)
    out_g = gpu.forward(x)
    assert is_gpu_tensor(out_g), f"forward of a GPU model returned {out_g!r}"
    close(out_g, out_c, f"{name}: forward", tol)
    if name.startswith("dropout"):
        assert np.array_equal(np.asarray(out_g), x), f"{name}: dropout must be the identity here"

    g = np.random.default_rng(2).standard_normal(out_c.shape).astype(np.float32)
    cpu.zero_grad()
    gpu.zero_grad()
    dx_c = cpu.backward(g, input_grad=True)
    dx_g = gpu.backward(g, input_grad=True)
    assert is_gpu_tensor(dx_g), f"backward of a GPU model returned {dx_g!r}"
    close(dx_g, dx_c, f"{name}: input gradient", tol)
    grads_c, grads_g = cpu.gradients(), gpu.gradients()
    assert len(grads_g) == len(grads_c) == len(cpu.parameters())
    for i, (a, b) in enumerate(zip(grads_c, grads_g)):
        assert isinstance(b, np.ndarray), f"gradients() of a GPU model: {type(b).__name__}"
        close(b, a, f"{name}: gradient {i}", tol)

    # A second backward adds into the gradients, on the GPU as on the CPU; zero_grad clears them.
    assert gpu.backward(g) is None and cpu.backward(g) is None
    for i, (a, b) in enumerate(zip(cpu.gradients(), gpu.gradients())):
        close(b, a, f"{name}: accumulated gradient {i}", tol)
    gpu.zero_grad()
    assert all(not np.any(b) for b in gpu.gradients()), f"{name}: zero_grad left gradients on the GPU"
    # Nothing above changed the parameters.
    for i, (p, q) in enumerate(zip(cpu.parameters(), gpu.parameters())):
        assert np.array_equal(p, q), f"{name}: parameter {i} changed without an optimizer step"


def test_gpu_model_accepts_gpu_inputs_and_gradients():
    """A cx.Tensor already on the GPU goes in without a host round trip; the results are the same."""
    cpu, gpu = twins(LAYERS["mlp"][0])
    x = inputs(64, 784)
    out_np = np.asarray(gpu.forward(x))
    out_t = gpu.forward(cx.Tensor(x).to("cuda"))
    assert is_gpu_tensor(out_t)
    assert np.array_equal(np.asarray(out_t), out_np), "the same input on the GPU gave another output"
    g = np.ones(out_np.shape, np.float32) / out_np.size
    dx_t = gpu.backward(cx.Tensor(g).to("cuda"), input_grad=True)
    cpu.forward(x)
    close(dx_t, cpu.backward(g, input_grad=True), "input gradient from a GPU grad_output", GEMM)


def test_parameters_of_a_gpu_model_are_host_copies():
    _, gpu = twins(LAYERS["linear"][0])
    before = [p.copy() for p in gpu.parameters()]
    for p in gpu.parameters():
        p[...] = 123.0
    for p, q in zip(gpu.parameters(), before):
        assert np.array_equal(p, q), "writing to parameters() of a GPU model changed it: they are copies"
    names = [n for n, _ in gpu.named_parameters()]
    assert names == ["0.weight", "0.bias"], names


def test_model_round_trip_cpu_gpu_cpu_and_save_load(tmp_path):
    cpu, gpu = twins(LAYERS["mlp"][0])
    x = inputs(16, 784)
    gpu.save(str(tmp_path / "gpu.cyxmodel"))
    loaded = cx.SequentialModel.load(str(tmp_path / "gpu.cyxmodel"))
    assert loaded.device == "cpu"
    assert all(np.array_equal(p, q) for p, q in zip(loaded.parameters(), cpu.parameters())), \
        "a model saved from the GPU loads with other parameters"
    assert gpu.to("cpu") is gpu and gpu.device == "cpu"
    assert all(np.array_equal(p, q) for p, q in zip(gpu.parameters(), cpu.parameters()))
    out = gpu.forward(x)
    assert isinstance(out, np.ndarray), f"a model moved back to the CPU returned {type(out).__name__}"
    assert np.array_equal(out, cpu.forward(x))
    gpu.to("cuda:0")
    assert gpu.device == "cuda:0"


def test_model_to_a_missing_gpu_raises_value_error_and_stays():
    cpu, gpu = twins(LAYERS["linear"][0])
    with pytest.raises(ValueError) as e:
        gpu.to(f"cuda:{GPU_COUNT}")
    assert f"cuda:{GPU_COUNT} requested" in str(e.value), str(e.value)
    assert gpu.device == "cuda:0"
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        gpu.to("tpu")
    x = inputs(8, 784)
    close(gpu.forward(x), cpu.forward(x), "forward after the refused moves", GEMM)


# ---- dropout with p > 0 -------------------------------------------------------------------------

def test_dropout_on_the_gpu_by_its_properties():
    p = 0.3
    keep = np.float32(1.0) - np.float32(p)
    scale = np.float32(1.0) / keep
    cx.manual_seed(5)
    model = sequential(lambda: cx.DropoutModule(p))().to("cuda")
    assert model.training
    ones = np.ones((200, 500), np.float32)
    mask = np.asarray(model.forward(ones))          # = mask / keep: 0 or 1/keep per element
    values = np.unique(mask)
    assert set(values.tolist()) <= {0.0, float(scale)}, f"mask values {values[:10]}, expected 0 and {scale}"
    kept = np.count_nonzero(mask) / mask.size
    # 100000 Bernoulli(0.7) draws: standard deviation 0.0014; 0.01 is 7 of them.
    assert abs(kept - keep) < 0.01, f"kept {kept:.4f} of the elements, expected {keep:.2f}"
    assert 0 < np.count_nonzero(mask, axis=1).min() and np.count_nonzero(mask, axis=1).max() < 500
    assert not all(np.array_equal(mask[0], row) for row in mask[1:]), "every row has the same mask"
    # backward multiplies by the same mask (of the last forward).
    g = np.random.default_rng(3).standard_normal(ones.shape).astype(np.float32)
    dx = model.backward(g, input_grad=True)
    assert is_gpu_tensor(dx)
    np.testing.assert_allclose(np.asarray(dx), g * mask, rtol=1e-6, atol=0, err_msg="dropout backward != grad * mask")
    # A new mask for every forward; the same masks again after the same manual_seed.
    second = np.asarray(model.forward(ones))
    assert not np.array_equal(second, mask), "two forwards drew the same mask"
    cx.manual_seed(5)
    again = sequential(lambda: cx.DropoutModule(p))().to("cuda")
    assert np.array_equal(np.asarray(again.forward(ones)), mask), "manual_seed does not repeat the GPU masks"
    # Applied to real inputs: x * mask.
    x = inputs(200, 500)
    out = np.asarray(model.forward(x))
    zeros = out == 0
    np.testing.assert_allclose(out[~zeros], x[~zeros] * scale, rtol=1e-6, err_msg="kept elements are x / keep")
    # eval(): the identity.
    model.eval()
    assert np.array_equal(np.asarray(model.forward(x)), x)


# ---- losses and accuracy --------------------------------------------------------------------------

def logits_and_labels(n=64, classes=10, seed=4):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, classes)) * 3).astype(np.float32)
    logits[0, 3] = 60.0  # a confident row: log-softmax must not overflow
    labels = rng.integers(0, classes, n).astype(np.int64)
    return logits, labels


def one_hot(labels, classes=10):
    return np.eye(classes, dtype=np.float32)[labels]


def probabilities(n, classes=10, seed=6):
    return np.random.default_rng(seed).dirichlet(np.ones(classes), n).astype(np.float32)


CE_TARGETS = {
    "int64": lambda y: (y, y),
    "int32": lambda y: (y.astype(np.int32), y),
    "one_hot": lambda y: (one_hot(y), one_hot(y)),
    "probabilities": lambda y: (probabilities(len(y)), probabilities(len(y))),
    "gpu_int64": lambda y: (cx.Tensor(y).to("cuda"), y),
    "gpu_one_hot": lambda y: (cx.Tensor(one_hot(y)).to("cuda"), one_hot(y)),
}


@pytest.mark.parametrize("target", list(CE_TARGETS))
def test_cross_entropy_on_gpu_outputs(target):
    logits, labels = logits_and_labels()
    t_gpu, t_cpu = CE_TARGETS[target](labels)
    out = cx.Tensor(logits).to("cuda")
    loss = cx.CrossEntropyLoss()
    value_c = loss.forward(logits, t_cpu)
    value_g = loss.forward(out, t_gpu)
    assert isinstance(value_g, float), type(value_g)
    np.testing.assert_allclose(value_g, value_c, rtol=1e-5, err_msg=f"CrossEntropyLoss ({target})")
    assert loss(out, t_gpu) == value_g
    grad_g = loss.backward(out, t_gpu)
    assert is_gpu_tensor(grad_g), f"CrossEntropyLoss.backward on a GPU output returned {grad_g!r}"
    close(grad_g, loss.backward(logits, t_cpu), f"CrossEntropyLoss.backward ({target})", LOSS_GRAD)


@pytest.mark.parametrize("where", ["numpy", "gpu"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_cross_entropy_ignore_index_on_gpu_outputs(where, ignore_index):
    """(N, T, V) logits with some positions marked ignore_index: loss, gradient (0 on those rows, the
    rest over the count of the others, counted on the device) and accuracy equal the CPU's."""
    rng = np.random.default_rng(12)
    logits = rng.standard_normal((4, 9, 7)).astype(np.float32)
    labels = rng.integers(0, 7, (4, 9))
    labels.flat[::4] = ignore_index
    out = cx.Tensor(logits).to("cuda")
    t = labels if where == "numpy" else cx.Tensor(labels).to("cuda")
    loss = cx.CrossEntropyLoss(ignore_index=ignore_index)
    np.testing.assert_allclose(loss.forward(out, t), loss.forward(logits, labels), rtol=1e-5)
    grad = np.asarray(loss.backward(out, t).to("cpu"))
    close(grad, loss.backward(logits, labels), "CrossEntropyLoss.backward with ignore_index", LOSS_GRAD)
    assert np.all(grad.reshape(-1, 7)[labels.reshape(-1) == ignore_index] == 0)
    assert cx.accuracy(out, t, ignore_index=ignore_index) == cx.accuracy(logits, labels, ignore_index=ignore_index)


@pytest.mark.parametrize("target", ["numpy", "gpu"])
def test_mse_on_gpu_outputs(target):
    rng = np.random.default_rng(8)
    output = rng.standard_normal((64, 10)).astype(np.float32)
    y = rng.standard_normal((64, 10)).astype(np.float32)
    out = cx.Tensor(output).to("cuda")
    t = y if target == "numpy" else cx.Tensor(y).to("cuda")
    loss = cx.MSELoss()
    value_g = loss.forward(out, t)
    assert isinstance(value_g, float)
    np.testing.assert_allclose(value_g, loss.forward(output, y), rtol=1e-5, err_msg="MSELoss")
    np.testing.assert_allclose(value_g, float(np.mean((output.astype(np.float64) - y) ** 2)), rtol=1e-5)
    grad_g = loss.backward(out, t)
    assert is_gpu_tensor(grad_g)
    close(grad_g, loss.backward(output, y), "MSELoss.backward", LOSS_GRAD)


def test_losses_of_a_gpu_model_match_the_cpu():
    """The model's GPU output fed straight to the losses (numpy targets), as in a training step."""
    cpu, gpu = twins(LAYERS["mlp"][0])
    x = inputs(64, 784)
    _, labels = logits_and_labels()
    out_c, out_g = cpu.forward(x), gpu.forward(x)
    ce = cx.CrossEntropyLoss()
    np.testing.assert_allclose(ce.forward(out_g, labels), ce.forward(out_c, labels), rtol=1e-4)
    close(ce.backward(out_g, labels), ce.backward(out_c, labels), "CE gradient of the model output",
          dict(rtol=1e-4, atol=1e-6))
    target = np.random.default_rng(9).standard_normal(out_c.shape).astype(np.float32)
    mse = cx.MSELoss()
    np.testing.assert_allclose(mse.forward(out_g, target), mse.forward(out_c, target), rtol=1e-4)


def test_accuracy_on_gpu_outputs():
    logits, labels = logits_and_labels(n=257)
    labels[: 100] = logits[: 100].argmax(axis=1)  # a known share right
    out = cx.Tensor(logits).to("cuda")
    want = cx.accuracy(logits, labels)
    assert want == np.mean(logits.argmax(axis=1) == labels)
    assert cx.accuracy(out, labels) == want
    assert cx.accuracy(out, cx.Tensor(labels).to("cuda")) == want
    assert cx.accuracy(out, labels.astype(np.int32)) == want


# ---- optimizers ---------------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": lambda: cx.SGDOptimizer(0.1),
    "sgd_momentum": lambda: cx.SGDOptimizer(0.1, momentum=0.9),
    "sgd_nesterov": lambda: cx.SGDOptimizer(0.1, momentum=0.9, nesterov=True),
    "sgd_weight_decay": lambda: cx.SGDOptimizer(0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda: cx.AdamOptimizer(0.01),
    "adam_weight_decay": lambda: cx.AdamOptimizer(0.01, weight_decay=0.01),
    "adamw": lambda: cx.AdamWOptimizer(0.01, weight_decay=0.1),
}


def mlp20():
    m = cx.SequentialModel()
    m.add(cx.LinearModule(20, 32))
    m.add(cx.TanhModule())
    m.add(cx.LinearModule(32, 16))
    m.add(cx.ReLUModule())
    m.add(cx.LinearModule(16, 5))
    return m


def run_steps(model, opt, steps=5):
    loss = cx.CrossEntropyLoss()
    losses = []
    for step in range(steps):
        rng = np.random.default_rng([7, step])
        x = rng.standard_normal((32, 20)).astype(np.float32)
        y = rng.integers(0, 5, 32)
        out = model.forward(x)
        losses.append(loss.forward(out, y))
        model.zero_grad()
        model.backward(loss.backward(out, y))
        opt.step(model)
    return losses


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_on_the_gpu_match_the_cpu(name):
    cpu, gpu = twins(mlp20, seed=3)
    losses_c = run_steps(cpu, OPTIMIZERS[name]())
    losses_g = run_steps(gpu, OPTIMIZERS[name]())
    np.testing.assert_allclose(losses_g, losses_c, rtol=1e-5, err_msg=f"{name}: losses of the 5 steps")
    moved = False
    cx.manual_seed(3)
    start = mlp20().parameters()
    for i, (p, q, s) in enumerate(zip(cpu.parameters(), gpu.parameters(), start)):
        np.testing.assert_allclose(q, p, rtol=0, atol=1e-5, err_msg=f"{name}: parameter {i} after 5 steps")
        moved = moved or not np.allclose(p, s, rtol=0, atol=1e-4)
    assert moved, f"{name}: 5 steps did not move the parameters (the comparison would prove nothing)"
    assert gpu.device == "cuda:0"


def deep_mlp():
    """15 linear layers, 30 parameters: more than one fused optimizer launch takes (24), and a bias-free
    layer among them."""
    m = cx.SequentialModel()
    m.add(cx.LinearModule(20, 12))
    for i in range(13):
        m.add(cx.TanhModule())
        m.add(cx.LinearModule(12, 12, bias=i != 6))
    m.add(cx.TanhModule())
    m.add(cx.LinearModule(12, 5))
    return m


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_fused_optimizer_steps_over_more_parameters_than_one_launch_takes(name):
    cpu, gpu = twins(deep_mlp, seed=5)
    assert len(gpu.parameters()) == 29
    run_steps(cpu, OPTIMIZERS[name](), steps=3)
    run_steps(gpu, OPTIMIZERS[name](), steps=3)
    for i, (p, q) in enumerate(zip(cpu.parameters(), gpu.parameters())):
        np.testing.assert_allclose(q, p, rtol=0, atol=1e-5, err_msg=f"{name}: parameter {i} after 3 steps")


# ---- TF32 -----------------------------------------------------------------------------------------

def test_tf32_is_off_by_default_and_stays_close_when_on():
    assert cx.cuda.is_tf32_enabled() is False, "TF32 must be off by default"
    cpu, gpu = twins(LAYERS["linear"][0])
    x = inputs(64, 784)
    want = cpu.forward(x)
    try:
        cx.cuda.set_tf32(True)
        assert cx.cuda.is_tf32_enabled() is True
        got = np.asarray(gpu.forward(x))
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-2, f"TF32 forward is {rel:.2e} away from float32 (relative, Frobenius)"
        g = np.random.default_rng(2).standard_normal(want.shape).astype(np.float32)
        cpu.backward(g)
        gpu.backward(g)
        for i, (a, b) in enumerate(zip(cpu.gradients(), gpu.gradients())):
            rel = np.linalg.norm(b - a) / np.linalg.norm(a)
            assert rel < 1e-2, f"TF32 gradient {i} is {rel:.2e} away from float32"
    finally:
        cx.cuda.set_tf32(False)
    assert cx.cuda.is_tf32_enabled() is False
    close(gpu.forward(x), want, "forward after set_tf32(False): float32 again", GEMM)


# ---- CuPy / PyTorch CUDA arrays -------------------------------------------------------------------

@pytest.fixture
def cuda_arrays():
    """From CuPy or PyTorch: (name, numpy -> CUDA array, CUDA array -> numpy, its transposed view,
    an object exposing __cuda_array_interface__ -> their CUDA array)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # their import-time warnings are not ours
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return ("cupy", cupy.asarray, cupy.asnumpy, lambda a: a.T, lambda t: cupy.asarray(t))
        except Exception:  # noqa: BLE001 - not installed or no device: try torch
            pass
        try:
            import torch
            if torch.cuda.is_available():
                return ("torch", lambda a: torch.from_numpy(a).to("cuda"), lambda t: t.cpu().numpy(),
                        lambda a: a.t(), lambda t: torch.as_tensor(t, device="cuda"))
        except Exception:  # noqa: BLE001
            pass
    pytest.skip("neither CuPy nor a CUDA-enabled PyTorch is importable here")


def test_cuda_array_interface_inputs(cuda_arrays):
    name, to_gpu, to_host, transpose, consume = cuda_arrays
    cpu, gpu = twins(LAYERS["mlp"][0])
    x = inputs(64, 784)
    xg = to_gpu(x)
    out = gpu.forward(xg)
    assert is_gpu_tensor(out)
    close(out, cpu.forward(x), f"forward of a {name} array", GEMM)
    labels = np.arange(64) % 10
    loss = cx.CrossEntropyLoss()
    grad = loss.backward(out, to_gpu(labels.astype(np.int64)))
    close(grad, loss.backward(cpu.forward(x), labels), f"CE with {name} labels", dict(rtol=1e-4, atol=1e-6))
    close(gpu.backward(to_gpu(np.asarray(grad)), input_grad=True), cpu.backward(np.asarray(grad), input_grad=True),
          f"backward of a {name} gradient", GEMM)
    # Not C-contiguous: refused, with the remedy.
    with pytest.raises(ValueError, match="C-contiguous"):
        gpu.forward(transpose(to_gpu(np.ascontiguousarray(x.T))))
    # Another float type: refused, not silently misread.
    with pytest.raises((TypeError, ValueError), match="float32"):
        gpu.forward(to_gpu(x.astype(np.float64)))
    # And the other way: a cx GPU tensor read by the library through the interface.
    back = to_host(consume(out))
    assert np.array_equal(back, np.asarray(out)), f"{name} reads another array through __cuda_array_interface__"


LT_SCRIPT = r"""
import sys
import numpy as np
import pycyxwiz as cx
out = {}
rng = np.random.RandomState(3)
for rows, fin, fout, bias in [(1, 1, 1, True), (3, 7, 5, True), (64, 784, 256, True), (64, 256, 10, False),
                              (33, 129, 65, True)]:
    for relu_after in (False, True):
        cx.manual_seed(rows + fin + fout)
        model = cx.SequentialModel()
        model.add(cx.LinearModule(fin, fout, bias=bias))
        if relu_after:
            model.add(cx.ReLUModule())
            model.add(cx.LinearModule(fout, 2))  # the ReLU is fused only when it is not the last layer
        model.to("cuda")
        x = rng.standard_normal((rows, fin)).astype(np.float32)
        y = model.forward(x)
        g = rng.standard_normal(y.shape).astype(np.float32)
        model.backward(g)
        key = f"{rows}x{fin}x{fout}-{bias}-{relu_after}"
        out[key + "-y"] = np.asarray(y)
        for i, grad in enumerate(model.gradients()):
            out[f"{key}-g{i}"] = grad
np.savez(sys.argv[1], **out)
"""


def test_cublaslt_epilogues_match_the_unfused_path(tmp_path):
    """Linear (+ ReLU) through cuBLASLt's BIAS / RELU_BIAS epilogues against the same model with
    CYXWIZ_CUBLASLT=0 (bias kernel, cuBLAS GEMM, ReLU kernel), in two processes (the switch is read
    once). Odd shapes included, where cuBLASLt may fall back itself. Under the emulator both runs take
    the emulator's one path; on a GPU this compares the epilogues with the kernels."""
    import os
    import subprocess
    import sys

    script = tmp_path / "lt.py"
    script.write_text(LT_SCRIPT)
    results = {}
    for setting in ("1", "0"):
        env = dict(os.environ, CYXWIZ_CUBLASLT=setting)
        path = tmp_path / f"lt{setting}.npz"
        proc = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"CYXWIZ_CUBLASLT={setting}: {proc.stderr[-2000:]}"
        results[setting] = dict(np.load(path))
    assert results["1"].keys() == results["0"].keys() and len(results["1"]) == 5 * (3 + 5) - 2
    for key, want in results["0"].items():
        close(results["1"][key], want, f"{key} (cuBLASLt epilogue vs unfused)", GEMM)


@pytest.mark.parametrize("make", [lambda: cx.EmbeddingModule(13, 8), lambda: cx.LayerNormModule(8),
                                  lambda: cx.PositionalEncodingModule(16, 8), lambda: cx.MultiHeadAttentionModule(8, 2),
                                  lambda: cx.TransformerEncoderModule(8, 2, 16)],
                         ids=["embedding", "layernorm", "positions", "attention", "transformer"])
def test_sequence_layers_move_to_the_gpu_and_back(gpu, make):
    """The sequence layers have GPU kernels (tests/gpu/test_gpu_sequence_layers.py compares them with the
    CPU's): a model holding one moves to the GPU, its parameters unchanged, and back. Every layer now
    runs on a GPU, so SequentialModel.to's refusal of a CPU-only layer has no layer left to show it."""
    model = cx.SequentialModel()
    model.add(make())
    before = [np.array(p, copy=True) for p in model.parameters()]
    assert model.to("cuda").device == "cuda:0"
    for i, (p, q) in enumerate(zip(before, model.parameters())):
        assert np.array_equal(p, q), f"parameter {i} changed on its way to the GPU"
    assert model.to("cpu").device == "cpu"
