"""Convolutional layers against torch (float32, copied weights) and central finite differences.

torch is the oracle for forward values, input gradients and parameter gradients over a grid of
shapes, strides, paddings, dilations and groups; the bound is relative to the largest value of the
oracle's tensor (1e-5, the issue's target). The finite-difference checks do not need torch: they
use tests/test_gradients.py's helpers and tolerances (its docstring explains them).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import pycyxwiz as cx
from test_gradients import assert_grad_close, module_objective, numeric_grad

torch = pytest.importorskip("torch")

REL = 1e-5


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(l.split(":", 1)[1].split()) for l in f if l.startswith("flags")), set())
    except OSError:
        return set()


# oneDNN's avx512_core: what its bfloat16 convolutions need at least (AVX512-BF16 / AMX run them natively).
AVX512_CORE = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags()


def onednn_available():
    return cx.build_info()["conv"].startswith("oneDNN")


def onednn_bf16_conv():
    """What build_info reports: oneDNN runs bfloat16 convolutions on this CPU."""
    return ", bfloat16 convolution)" in cx.build_info()["conv"]


def test_build_info_says_whether_onednn_has_bfloat16_convolutions_on_this_cpu():
    """The report follows the CPU (oneDNN has bfloat16 convolutions from avx512_core up), and says what
    autocast does without them: ONEDNN_MAX_CPU_ISA=AVX2 makes any x86 CPU one without them, and then a
    convolution under bfloat16 autocast keeps float32 operands."""
    if not onednn_available():
        pytest.skip("oneDNN is not installed (pip install onednn-cpu-gomp): " + cx.build_info()["conv"])
    assert onednn_bf16_conv() == AVX512_CORE, cx.build_info()["conv"]
    script = ("import numpy as np, pycyxwiz as cx\n"
              "conv = cx.Conv2DModule(4, 6, 3, padding=1)\n"
              "with cx.autocast('bfloat16'):\n"
              "    conv.forward(np.ones((2, 4, 8, 8), np.float32))\n"
              "print(conv._saved_tensors()[0]['dtype'])\n"
              "print(cx.build_info()['conv'])\n")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kept, conv = out.stdout.splitlines()[:2]
    assert "no bfloat16 convolution for this CPU's ISA" in conv and "rounds a convolution's operands" in conv, conv
    assert kept == "float32", kept


@pytest.fixture(params=["onednn", "im2col"])
def conv_kernel(request):
    """Runs a test with each convolution kernel: oneDNN's (when the onednn-cpu-gomp wheel is installed;
    CI installs it) and the im2col + sgemm path."""
    if request.param == "onednn" and not onednn_available():
        pytest.skip("oneDNN is not installed (pip install onednn-cpu-gomp): " + cx.build_info()["conv"])
    cx._core._set_dnnl_enabled(request.param == "onednn")
    try:
        yield request.param
    finally:
        cx._core._set_dnnl_enabled(True)


def assert_rel_close(ours, theirs, what, rel=REL):
    theirs = np.asarray(theirs, dtype=np.float64)
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    scale = max(np.abs(theirs).max(), 1e-30)
    err = np.abs(ours - theirs).max() / scale
    assert err <= rel, f"{what}: max error {err:.3g} of the largest value (> {rel})"


def copy_params(ours, theirs):
    """torch parameters -> ours, through the named views (same names, same layout)."""
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert mine[name].shape == tuple(p.shape), name
        mine[name][...] = p.detach().numpy()


def compare_module(ours, theirs, x, what, train=True):
    """Forward, input gradient and parameter gradients of `ours` and `theirs` on x."""
    rng = np.random.default_rng(1)
    if isinstance(theirs, torch.nn.Module):
        theirs.zero_grad()
    xt = torch.tensor(x, requires_grad=True)
    yt = theirs(xt)
    r = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    (yt * torch.tensor(r)).sum().backward()
    y = ours.forward(x)
    assert_rel_close(y, yt.detach().numpy(), f"{what} forward")
    ours.zero_grad()
    dx = ours.backward(r, input_grad=True) if isinstance(ours, cx.SequentialModel) else ours.backward(r)
    assert_rel_close(dx, xt.grad.numpy(), f"{what} input gradient")
    grads = dict(zip([n for n, _ in ours.named_parameters()], ours.gradients()))
    for name, p in theirs.named_parameters():
        assert_rel_close(grads[name], p.grad.numpy(), f"{what} gradient of {name}")


CONV_CASES = [
    # (N, C, H, W, out, kernel, stride, padding, dilation, groups, bias)
    (2, 3, 8, 8, 4, 3, 1, 0, 1, 1, True),
    (2, 3, 9, 7, 6, (3, 2), (2, 1), (1, 0), 1, 1, True),
    (1, 4, 10, 10, 4, 3, 2, 2, 2, 2, False),
    (3, 4, 6, 6, 8, 1, 1, 0, 1, 4, True),
    (2, 2, 5, 5, 2, 5, 1, 2, 1, 2, True),
    (2, 3, 7, 7, 5, 3, 3, 1, 1, 1, True),
    (4, 16, 8, 8, 32, 3, 1, 1, 1, 1, True),
    (2, 6, 11, 9, 6, 3, (1, 2), (2, 1), (2, 1), 3, True),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv2d_matches_torch(case, conv_kernel):
    n, c, h, w, out, k, s, p, d, g, bias = case
    torch.manual_seed(0)
    theirs = torch.nn.Conv2d(c, out, k, stride=s, padding=p, dilation=d, groups=g, bias=bias)
    ours = cx.Conv2DModule(c, out, k, stride=s, padding=p, dilation=d, groups=g, use_bias=bias)
    copy_params(ours, theirs)
    x = np.random.default_rng(0).standard_normal((n, c, h, w)).astype(np.float32)
    compare_module(ours, theirs, x, f"Conv2DModule case {case}")
    assert ours.output_shape((c, h, w)) == (None,) + tuple(theirs(torch.tensor(x)).shape[1:])


def test_conv2d_init_matches_torch_bounds():
    conv = cx.Conv2DModule(4, 6, 3, groups=2)
    w, b = conv.parameters()
    bound = 1 / np.sqrt(2 * 3 * 3)  # fan_in = in/groups * kh * kw, as torch's kaiming_uniform(a=sqrt(5))
    assert w.shape == (6, 2, 3, 3) and b.shape == (6,)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert np.abs(b).max() <= bound


POOL_CASES = [
    # (kind, N, C, H, W, pool, stride, padding)
    ("max", 2, 3, 8, 8, 2, None, 0),
    ("max", 2, 2, 9, 7, 3, 2, 1),
    ("max", 1, 2, 6, 10, (2, 3), (1, 2), (1, 1)),
    ("avg", 2, 3, 8, 8, 2, None, 0),
    ("avg", 2, 2, 9, 7, 3, 2, 1),
    ("avg", 1, 2, 6, 10, (2, 3), (1, 2), (1, 1)),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(POOL_CASES)])
def test_pool2d_matches_torch(case):
    kind, n, c, h, w, k, s, p = case
    if kind == "max":
        ours, theirs = cx.MaxPool2DModule(k, s, p), torch.nn.MaxPool2d(k, s, p)
    else:
        ours, theirs = cx.AvgPool2DModule(k, s, p), torch.nn.AvgPool2d(k, s, p)
    x = np.random.default_rng(2).standard_normal((n, c, h, w)).astype(np.float32)
    compare_module(ours, theirs, x, f"{kind} pool {case}")


def test_max_pool_ties_and_nan_follow_torch():
    x = np.zeros((1, 1, 4, 4), np.float32)  # every window a tie: the first element wins, as torch
    x[0, 0, 3, 3] = np.nan
    ours, theirs = cx.MaxPool2DModule(2), torch.nn.MaxPool2d(2)
    xt = torch.tensor(x, requires_grad=True)
    yt = theirs(xt)
    yt.sum().backward()
    y = ours.forward(x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(yt.detach().numpy()))
    np.testing.assert_array_equal(ours.backward(np.ones_like(y)), xt.grad.numpy())


def test_global_avg_pool_and_flatten_match_torch():
    x = np.random.default_rng(3).standard_normal((3, 5, 4, 6)).astype(np.float32)
    gap = cx.GlobalAvgPool2DModule()
    xt = torch.tensor(x, requires_grad=True)
    yt = xt.mean(dim=(2, 3))
    r = np.random.default_rng(4).standard_normal(yt.shape).astype(np.float32)
    (yt * torch.tensor(r)).sum().backward()
    assert_rel_close(gap.forward(x), yt.detach().numpy(), "GlobalAvgPool2DModule forward")
    assert_rel_close(gap.backward(r), xt.grad.numpy(), "GlobalAvgPool2DModule backward")
    flat = cx.FlattenModule()
    y = flat.forward(x)
    np.testing.assert_array_equal(y, x.reshape(3, -1))
    np.testing.assert_array_equal(flat.backward(y * 2), x * 2)


ACTIVATIONS = [
    (lambda: cx.LeakyReLUModule(), lambda: torch.nn.LeakyReLU()),
    (lambda: cx.LeakyReLUModule(0.2), lambda: torch.nn.LeakyReLU(0.2)),
    (lambda: cx.ELUModule(), lambda: torch.nn.ELU()),
    (lambda: cx.ELUModule(0.5), lambda: torch.nn.ELU(0.5)),
    (lambda: cx.SwishModule(), lambda: torch.nn.SiLU()),
    (lambda: cx.MishModule(), lambda: torch.nn.Mish()),
]


@pytest.mark.parametrize("pair", ACTIVATIONS, ids=["leaky", "leaky0.2", "elu", "elu0.5", "swish", "mish"])
def test_activations_match_torch(pair):
    ours, theirs = pair[0](), pair[1]()
    x = (np.random.default_rng(5).standard_normal((4, 3, 5, 5)) * 4).astype(np.float32)
    x[0, 0, 0, :3] = [30.0, -30.0, 0.0]  # softplus's threshold, saturation, the kink
    compare_module(ours, theirs, x, ours.__class__.__name__)


@pytest.mark.parametrize("shape", [(16, 6), (8, 6, 5), (4, 6, 5, 3)], ids=["1d", "1d-seq", "2d"])
def test_batchnorm_matches_torch_over_steps(shape):
    two_d = len(shape) == 4
    ours = cx.BatchNorm2DModule(6, momentum=0.2) if two_d else cx.BatchNorm1DModule(6, momentum=0.2)
    theirs = torch.nn.BatchNorm2d(6, momentum=0.2) if two_d else torch.nn.BatchNorm1d(6, momentum=0.2)
    rng = np.random.default_rng(6)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    copy_params(ours, theirs)
    for step in range(3):
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        compare_module(ours, theirs, x, f"{ours.__class__.__name__} train step {step}")
    buffers = dict(ours.named_buffers())
    for name, b in theirs.named_buffers():
        assert_rel_close(buffers[name], b.numpy(), f"buffer {name}")
    assert int(buffers["num_batches_tracked"]) == 3
    ours.eval()
    theirs.eval()
    x = rng.standard_normal(shape).astype(np.float32)
    compare_module(ours, theirs, x, "eval")
    assert int(dict(ours.named_buffers())["num_batches_tracked"]) == 3  # eval does not count


def test_batchnorm_refuses_one_value_per_channel():
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        cx.BatchNorm1DModule(3).forward(np.ones((1, 3), np.float32))


def make_resnet_pair(seed=0):
    """A small ResNet as ours and torch's, with torch's weights copied into ours."""
    torch.manual_seed(seed)

    class Block(torch.nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(),
                torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(cout))
            self.shortcut = (torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))
                             if stride != 1 or cin != cout else None)

        def forward(self, x):
            return self.body(x) + (self.shortcut(x) if self.shortcut is not None else x)

    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                 Block(8, 8, 1), torch.nn.ReLU(), Block(8, 16, 2), torch.nn.ReLU(),
                                 torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))

    def block(cin, cout, stride):
        body = cx.SequentialModel()
        for m in (cx.Conv2DModule(cin, cout, 3, stride, 1, use_bias=False), cx.BatchNorm2DModule(cout), cx.ReLUModule(),
                  cx.Conv2DModule(cout, cout, 3, 1, 1, use_bias=False), cx.BatchNorm2DModule(cout)):
            body.add(m)
        shortcut = None
        if stride != 1 or cin != cout:
            shortcut = cx.SequentialModel()
            shortcut.add(cx.Conv2DModule(cin, cout, 1, stride, use_bias=False))
            shortcut.add(cx.BatchNorm2DModule(cout))
        return cx.ResidualModule(body, shortcut)

    ours = cx.SequentialModel()
    for m in (cx.Conv2DModule(3, 8, 3, 1, 1, use_bias=False), cx.BatchNorm2DModule(8), cx.ReLUModule(), block(8, 8, 1),
              cx.ReLUModule(), block(8, 16, 2), cx.ReLUModule(), cx.GlobalAvgPool2DModule(), cx.FlattenModule(),
              cx.LinearModule(16, 10)):
        ours.add(m)
    mine = dict(ours.named_parameters())
    assert list(mine) == [n for n, _ in theirs.named_parameters()]  # torch's names and order
    for name, p in theirs.named_parameters():
        mine[name][...] = p.detach().numpy()
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    return ours, theirs


def test_resnet_matches_torch_in_training_and_eval(conv_kernel):
    ours, theirs = make_resnet_pair()
    x = np.random.default_rng(7).standard_normal((6, 3, 8, 8)).astype(np.float32)
    compare_module(ours, theirs, x, "ResNet train")
    buffers = dict(ours.named_buffers())
    for name, b in theirs.named_buffers():
        assert_rel_close(buffers[name], b.numpy(), f"buffer {name}")
    ours.eval()
    theirs.eval()
    compare_module(ours, theirs, x, "ResNet eval")


def test_summary_and_wrong_input_name_the_module():
    model = cx.SequentialModel()
    model.add(cx.Conv2DModule(1, 8, 3))
    model.add(cx.MaxPool2DModule(2))
    model.add(cx.FlattenModule())
    model.add(cx.LinearModule(72, 10))
    assert model.output_shape((1, 8, 8)) == (None, 10)
    table = model.summary((1, 8, 8))
    assert "(N, 8, 6, 6)" in table and "(N, 8, 3, 3)" in table and "(N, 72)" in table
    with pytest.raises(ValueError, match=r"expects 1 input channel, got 3 in input \(4, 3, 8, 8\)"):
        model.forward(np.zeros((4, 3, 8, 8), np.float32))
    with pytest.raises(ValueError, match=r"LinearModule.*\(N, 72\).*\(N, 32\)"):
        model.output_shape((1, 6, 6))
    with pytest.raises(ValueError, match="cannot follow"):
        model.add(cx.LinearModule(11, 2))
    mlp = cx.SequentialModel()
    mlp.add(cx.LinearModule(4, 3))
    with pytest.raises(ValueError, match="FlattenModule"):
        mlp.output_shape((1, 2, 2))


# ------------------------------------------------------------------ finite differences (no torch)

def check_module_by_differences(module, x, what):
    r = np.random.default_rng(11).standard_normal(module.forward(x).shape).astype(np.float32)
    module.zero_grad()
    module.forward(x)
    dx = module.backward(r)
    grads = [g.copy() for g in module.gradients()]
    objective = module_objective(module, x, r)
    assert_grad_close(dx, numeric_grad(objective, x), f"{what}: input")
    for (name, p), g in zip(module.named_parameters(), grads):
        assert_grad_close(g, numeric_grad(objective, p), f"{what}: {name}")


def test_finite_differences_conv_pool_batchnorm_residual(conv_kernel):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    check_module_by_differences(cx.Conv2DModule(4, 4, 3, stride=2, padding=1, dilation=1, groups=2), x, "Conv2DModule")
    check_module_by_differences(cx.AvgPool2DModule(3, 2, 1), x, "AvgPool2DModule")
    bn = cx.BatchNorm2DModule(4)
    bn.parameters()[0][...] = rng.uniform(0.5, 1.5, 4)
    # Each perturbed forward updates the running statistics; training-mode outputs do not read them.
    check_module_by_differences(bn, x, "BatchNorm2DModule")
    body = cx.SequentialModel()
    body.add(cx.Conv2DModule(4, 4, 3, padding=1))
    body.add(cx.TanhModule())
    check_module_by_differences(cx.ResidualModule(body), x, "ResidualModule")
    check_module_by_differences(cx.MishModule(), x, "MishModule")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_conv2d_under_autocast_multiplies_16_bit_operands(dtype, conv_kernel):
    """Under cx.autocast the convolution rounds its input, weight and (in backward) gradient to the 16-bit
    type and accumulates in float32: the oracle is torch's float64 convolution of the rounded operands."""
    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rnd = lambda a: torch.tensor(a).to(tdtype).to(torch.float64)  # noqa: E731 - nearest, ties to even
    cx.manual_seed(4)
    conv = cx.Conv2DModule(4, 6, 3, stride=2, padding=1, groups=2)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4, 9, 9)).astype(np.float32)
    w, b = (p.copy() for p in conv.parameters())
    with cx.autocast(dtype):
        y = conv.forward(x)
    r = rng.standard_normal(y.shape).astype(np.float32)
    conv.zero_grad()
    dx = conv.backward(r)  # outside autocast: backward follows its forward
    # oneDNN's bfloat16 kernels keep the 16-bit input (half the bytes); the other paths the rounded float32.
    # Where build_info says this CPU has no oneDNN bfloat16 convolution (AVX2 only), the layer rounds its
    # operands for the float32 kernel.
    kept = conv._saved_tensors()[0]["dtype"]
    onednn_bf16 = dtype == "bfloat16" and conv_kernel == "onednn" and onednn_bf16_conv()
    assert kept == ("bfloat16" if onednn_bf16 else "float32"), kept
    xt, wt = rnd(x).requires_grad_(), rnd(w).requires_grad_()
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.conv2d(xt, wt, bt, stride=2, padding=1, groups=2)
    yt.backward(rnd(r))
    assert_rel_close(y, yt.detach().numpy(), f"{dtype} forward")
    assert_rel_close(dx, xt.grad.numpy(), f"{dtype} input gradient")
    dw, db = conv.gradients()
    assert_rel_close(dw, wt.grad.numpy(), f"{dtype} weight gradient")
    assert_rel_close(db, bt.grad.numpy(), f"{dtype} bias gradient")
    # and it differs from the float32 convolution (the rounding is real)
    conv2 = cx.Conv2DModule(4, 6, 3, stride=2, padding=1, groups=2)
    for mine, theirs in zip(conv2.parameters(), (w, b)):
        mine[...] = theirs
    assert np.abs(conv2.forward(x) - y).max() > 1e-4
