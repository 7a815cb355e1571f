"""Backward passes of every module and loss, checked against central finite differences.

The oracle never looks at the engine's backward: for a module we build the scalar objective
L = sum(forward(x) * R) for a fixed random R (so dL/dy = R), perturb one input or parameter element
at a time (parameters() returns writable views, so perturbing them changes the model), and take
(L(+h) - L(-h)) / (2h) in float64 from the engine's float32 outputs. For losses the objective is the
loss value itself.

Tolerances (used everywhere below unless a test says otherwise). The engine computes in float32
(unit roundoff u ~ 6e-8). With a step h = 3e-3 on O(1) inputs:
  * truncation error of the central difference is ~ h^2 |f'''| / 6 ~ 1e-5;
  * rounding error is ~ u * sum|y_i R_i| / h, i.e. ~ 1e-5 * sqrt(n) for n O(1) outputs, ~1e-4 here;
  * the step actually taken differs from h after float32 rounding, so we divide by the real step.
rtol = 1e-2 and atol = 2e-4 leave a wide margin over those errors (the largest deviation seen on
these cases is ~3e-5, under a twentieth of the allowance), while any real mistake in a backward
formula (a missing factor or term, a transposed weight, a wrong sign, a gradient that is overwritten
instead of accumulated) shows up as an O(1) relative error and fails. atol is kept well below the
smallest gradients checked (~1e-2, cross-entropy averaged over a batch), so it cannot hide them.
"""

import numpy as np
import pytest

import pycyxwiz as cx

EPS = 3e-3
RTOL = 1e-2
ATOL = 2e-4


# --------------------------------------------------------------------------------------------- helpers

def numeric_grad(objective, arr, eps=EPS):
    """Central differences of objective() (a float) w.r.t. every element of the float32 array `arr`,
    which is perturbed in place and restored afterwards."""
    assert arr.dtype == np.float32 and arr.flags.writeable
    grad = np.zeros(arr.shape, dtype=np.float64)
    for idx in np.ndindex(arr.shape):
        orig = arr[idx].copy()
        arr[idx] = orig + np.float32(eps)
        x_plus = float(arr[idx])
        f_plus = objective()
        arr[idx] = orig - np.float32(eps)
        x_minus = float(arr[idx])
        f_minus = objective()
        arr[idx] = orig
        grad[idx] = (f_plus - f_minus) / (x_plus - x_minus)
    return grad


def module_objective(module, x, r):
    """L(x, params) = sum(module.forward(x) * r), accumulated in float64."""
    r64 = r.astype(np.float64)
    return lambda: float(np.sum(module.forward(x).astype(np.float64) * r64))


def assert_grad_close(analytic, numeric, what, rtol=RTOL, atol=ATOL):
    assert analytic.shape == numeric.shape, f"{what}: shape {analytic.shape} != {numeric.shape}"
    assert np.all(np.isfinite(analytic)), f"{what}: non-finite analytic gradient"
    np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol, err_msg=what)


def check_module_gradients(module, x, seed):
    """Compares module.backward (input gradient) and the accumulated parameter gradients with
    finite differences of sum(forward(x) * R)."""
    rng = np.random.RandomState(seed)
    x = np.array(x, dtype=np.float32, copy=True)
    y = module.forward(x)
    r = rng.standard_normal(y.shape).astype(np.float32)

    module.zero_grad()
    module.forward(x)
    dx = np.array(module.backward(r), dtype=np.float64)
    param_grads = [np.array(g, dtype=np.float64) for g in module.gradients()]

    objective = module_objective(module, x, r)
    assert_grad_close(dx, numeric_grad(objective, x), f"{module!r}: d/dx")
    params = module.parameters()
    assert len(params) == len(param_grads)
    names = ["weight", "bias"]
    for name, p, g in zip(names, params, param_grads):
        assert_grad_close(g, numeric_grad(objective, p), f"{module!r}: d/d{name}")
    return dx, param_grads


def random_away_from_zero(rng, shape, low=0.1, high=3.0):
    """Values with low <= |v| <= high and random sign (keeps ReLU away from its kink)."""
    mag = rng.uniform(low, high, size=shape)
    sign = np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float32)


# --------------------------------------------------------------------------------------------- Linear

LINEAR_SHAPES = [  # (batch, in_features, out_features)
    (1, 1, 1),
    (1, 4, 3),
    (5, 3, 2),
    (7, 6, 4),
    (3, 8, 9),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("batch,fin,fout", LINEAR_SHAPES)
def test_linear_gradients_match_finite_differences(batch, fin, fout, bias):
    cx.manual_seed(1234 + batch * 100 + fin * 10 + fout)
    layer = cx.LinearModule(fin, fout, bias=bias)
    assert len(layer.parameters()) == (2 if bias else 1)
    rng = np.random.RandomState(batch * 31 + fin * 7 + fout)
    x = rng.uniform(-2, 2, size=(batch, fin)).astype(np.float32)
    check_module_gradients(layer, x, seed=fin + fout)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_gradients_match_closed_form(bias):
    # A second, tighter oracle for the one layer with a simple closed form: dx = g W, dW = g^T x, db = sum g.
    cx.manual_seed(7)
    layer = cx.LinearModule(6, 5, bias=bias)
    rng = np.random.RandomState(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    g = rng.standard_normal((4, 5)).astype(np.float32)
    w = np.array(layer.parameters()[0], dtype=np.float64)
    layer.zero_grad()
    layer.forward(x)
    dx = layer.backward(g)
    grads = layer.gradients()
    np.testing.assert_allclose(dx, g.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[0], g.astype(np.float64).T @ x.astype(np.float64), rtol=1e-5, atol=1e-5)
    if bias:
        np.testing.assert_allclose(grads[1], g.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------- activations

ELEMENTWISE_SHAPES = [(1, 1), (1, 5), (4, 3), (2, 3, 4), (6,)]
ACTIVATIONS = {
    "relu": cx.ReLUModule,
    "sigmoid": cx.SigmoidModule,
    "tanh": cx.TanhModule,
    "gelu": cx.GELUModule,
    "softmax": cx.SoftmaxModule,
}


@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradients_match_finite_differences(name, shape):
    rng = np.random.RandomState(len(shape) * 101 + int(np.prod(shape)))
    if name == "relu":
        x = random_away_from_zero(rng, shape)  # |x| >= 0.1 >> EPS: no difference straddles the kink
    else:
        x = rng.uniform(-3, 3, size=shape).astype(np.float32)
    module = ACTIVATIONS[name]()
    assert module.parameters() == [] and module.num_parameters() == 0
    check_module_gradients(module, x, seed=int(np.prod(shape)))


def test_relu_gradient_is_zero_for_negative_inputs_and_passes_through_positive():
    # Independent of FD: the derivative is the indicator x > 0, including at the kink (0 as PyTorch).
    x = np.array([[-2.0, -1e-3, 0.0, 1e-3, 2.0]], dtype=np.float32)
    g = np.array([[1.5, 2.5, 3.5, 4.5, 5.5]], dtype=np.float32)
    relu = cx.ReLUModule()
    relu.forward(x)
    np.testing.assert_array_equal(relu.backward(g), np.where(x > 0, g, 0.0))


def test_softmax_gradient_rows_sum_to_zero():
    # Softmax outputs sum to 1 per row, so the input gradient sums to 0 per row for any upstream grad.
    rng = np.random.RandomState(5)
    x = rng.standard_normal((3, 2, 7)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    sm = cx.SoftmaxModule()
    sm.forward(x)
    dx = sm.backward(g)
    np.testing.assert_allclose(dx.sum(axis=-1), 0.0, atol=1e-6)


# --------------------------------------------------------------------------------------------- dropout

@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("shape", [(1, 7), (6, 5), (2, 3, 4)], ids=lambda s: "x".join(map(str, s)))
def test_dropout_train_backward_is_grad_times_mask(p, shape):
    rng = np.random.RandomState(int(p * 10) + len(shape))
    x = random_away_from_zero(rng, shape, low=0.5)  # nonzero, so mask = y / x is well defined
    g = rng.standard_normal(shape).astype(np.float32)
    drop = cx.DropoutModule(p)
    drop.train()
    cx.manual_seed(99)
    y = drop.forward(x)
    mask = y.astype(np.float64) / x.astype(np.float64)
    scale = 1.0 / (1.0 - p)
    kept = np.isclose(mask, scale, rtol=1e-6)
    dropped = mask == 0.0
    assert np.all(kept | dropped), f"mask values other than 0 and 1/(1-p): {np.unique(mask)}"
    exact_mask = np.where(kept, np.float32(scale), np.float32(0.0)).astype(np.float32)
    np.testing.assert_allclose(drop.backward(g), g * exact_mask, rtol=1e-6, atol=0)
    # The mask stays the one of the last forward: a second backward sees the same mask.
    np.testing.assert_allclose(drop.backward(g), g * exact_mask, rtol=1e-6, atol=0)


@pytest.mark.parametrize("p", [0.3, 0.6])
def test_dropout_train_gradient_matches_finite_differences_with_reseeded_mask(p):
    # Reseeding before each forward replays the same mask, which turns dropout into a fixed
    # (piecewise-)linear map that finite differences can check.
    rng = np.random.RandomState(11)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    r = rng.standard_normal((4, 6)).astype(np.float32)
    drop = cx.DropoutModule(p)
    drop.train()

    def objective():
        cx.manual_seed(2024)
        return float(np.sum(drop.forward(x).astype(np.float64) * r))

    cx.manual_seed(2024)
    drop.forward(x)
    dx = drop.backward(r).astype(np.float64)
    assert 0 < np.count_nonzero(dx) < dx.size, "a mask that keeps or drops everything makes this test weak"
    assert_grad_close(dx, numeric_grad(objective, x), "dropout d/dx")


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_dropout_eval_mode_is_identity_both_ways(p):
    rng = np.random.RandomState(2)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    g = rng.standard_normal((5, 4)).astype(np.float32)
    drop = cx.DropoutModule(p)
    drop.eval()
    assert not drop.training
    np.testing.assert_array_equal(drop.forward(x), x)
    np.testing.assert_array_equal(drop.backward(g), g)


def test_dropout_p0_in_train_mode_is_identity_both_ways():
    rng = np.random.RandomState(4)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    g = rng.standard_normal((3, 4)).astype(np.float32)
    drop = cx.DropoutModule(0.0)
    drop.train()
    np.testing.assert_array_equal(drop.forward(x), x)
    np.testing.assert_array_equal(drop.backward(g), g)


# --------------------------------------------------------------------------------------------- losses

LOSS_SHAPES = [(1, 2), (1, 5), (4, 3), (8, 6)]
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def logits_and_labels(batch, classes, seed):
    rng = np.random.RandomState(seed)
    logits = (rng.standard_normal((batch, classes)) * 2).astype(np.float32)
    labels = rng.randint(0, classes, size=batch)
    return logits, labels


def check_loss_gradient(loss, output, target):
    output = np.array(output, dtype=np.float32, copy=True)
    analytic = np.array(loss.backward(output, target), dtype=np.float64)
    numeric = numeric_grad(lambda: float(loss.forward(output, target)), output)
    assert_grad_close(analytic, numeric, f"{loss!r} d/d(output)")
    return analytic


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch,classes", LOSS_SHAPES)
def test_cross_entropy_gradient_int_labels(batch, classes, dtype):
    logits, labels = logits_and_labels(batch, classes, seed=batch * 10 + classes)
    check_loss_gradient(cx.CrossEntropyLoss(), logits, labels.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_cross_entropy_gradient_whole_number_float_labels(dtype):
    logits, labels = logits_and_labels(5, 4, seed=8)
    ce = cx.CrossEntropyLoss()
    g_float = check_loss_gradient(ce, logits, labels.astype(dtype))
    np.testing.assert_array_equal(g_float, ce.backward(logits, labels.astype(np.int64)))


@pytest.mark.parametrize("batch,classes", LOSS_SHAPES)
def test_cross_entropy_gradient_one_hot_rows(batch, classes):
    logits, labels = logits_and_labels(batch, classes, seed=batch + classes)
    one_hot = np.eye(classes, dtype=np.float32)[labels]
    ce = cx.CrossEntropyLoss()
    g = check_loss_gradient(ce, logits, one_hot)
    # One-hot rows and class indices describe the same loss.
    np.testing.assert_allclose(g, ce.backward(logits, labels), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("normalised", [True, False], ids=["probabilities", "unnormalised"])
@pytest.mark.parametrize("batch,classes", LOSS_SHAPES)
def test_cross_entropy_gradient_probability_rows(batch, classes, normalised):
    logits, _ = logits_and_labels(batch, classes, seed=3 * batch + classes)
    rng = np.random.RandomState(batch * classes)
    if normalised:
        target = rng.dirichlet(np.ones(classes), size=batch).astype(np.float32)
    else:  # sum_c p_c != 1: the loss is still sum_c p_c (lse - x_c), with gradient mass * softmax - p
        target = rng.uniform(0.0, 2.0, size=(batch, classes)).astype(np.float32)
    check_loss_gradient(cx.CrossEntropyLoss(), logits, target)


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (5, 3), (2, 3, 4), (7,)], ids=lambda s: "x".join(map(str, s)))
def test_mse_gradient_matches_finite_differences(shape):
    rng = np.random.RandomState(int(np.prod(shape)))
    output = rng.standard_normal(shape).astype(np.float32)
    target = rng.standard_normal(shape).astype(np.float32)
    check_loss_gradient(cx.MSELoss(), output, target)


# --------------------------------------------------------------------------------------------- whole model

def build_mlp(seed, fin=5, classes=4):
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(fin, 7))
    model.add(cx.TanhModule())
    model.add(cx.LinearModule(7, 6))
    model.add(cx.GELUModule())
    model.add(cx.LinearModule(6, classes))
    return model


@pytest.mark.parametrize("batch", [1, 6])
def test_sequential_model_gradients_match_finite_differences(batch):
    model = build_mlp(seed=10 + batch)
    ce = cx.CrossEntropyLoss()
    rng = np.random.RandomState(batch)
    x = rng.standard_normal((batch, 5)).astype(np.float32)
    labels = rng.randint(0, 4, size=batch)

    model.zero_grad()
    out = model.forward(x)
    assert model.backward(ce.backward(out, labels)) is None  # no input gradient unless asked
    analytic = [np.array(g, dtype=np.float64) for g in model.gradients()]

    model.zero_grad()
    out = model.forward(x)
    dx = np.array(model.backward(ce.backward(out, labels), input_grad=True), dtype=np.float64)
    # Asking for the input gradient must not change the parameter gradients.
    for a, g in zip(analytic, model.gradients()):
        np.testing.assert_allclose(g, a, rtol=1e-6, atol=1e-7)

    def objective():
        return float(ce.forward(model.forward(x), labels))

    params = model.parameters()
    assert [p.shape for p in params] == [(7, 5), (7,), (6, 7), (6,), (4, 6), (4,)]
    for i, (p, a) in enumerate(zip(params, analytic)):
        assert_grad_close(a, numeric_grad(objective, p), f"parameter {i} {p.shape}")
    assert_grad_close(dx, numeric_grad(objective, x), "model input")


def test_sequential_model_with_dropout_gradient_matches_finite_differences():
    cx.manual_seed(3)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 8))
    model.add(cx.SigmoidModule())
    model.add(cx.DropoutModule(0.4))
    model.add(cx.LinearModule(8, 3))
    model.add(cx.SoftmaxModule())
    mse = cx.MSELoss()
    rng = np.random.RandomState(6)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    target = rng.dirichlet(np.ones(3), size=5).astype(np.float32)

    def objective():
        cx.manual_seed(77)  # the same dropout mask on every evaluation
        return float(mse.forward(model.forward(x), target))

    model.zero_grad()
    cx.manual_seed(77)
    out = model.forward(x)
    model.backward(mse.backward(out, target))
    analytic = [np.array(g, dtype=np.float64) for g in model.gradients()]
    # MSE on softmax outputs gives small gradients; scale atol down with them.
    for i, (p, a) in enumerate(zip(model.parameters(), analytic)):
        assert_grad_close(a, numeric_grad(objective, p), f"parameter {i}", atol=1e-4)


# --------------------------------------------------------------------------------------------- accumulation

def test_backward_accumulates_and_zero_grad_resets():
    model = build_mlp(seed=21)
    ce = cx.CrossEntropyLoss()
    rng = np.random.RandomState(21)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    labels = rng.randint(0, 4, size=4)

    model.zero_grad()
    out = model.forward(x)
    g = ce.backward(out, labels)
    model.backward(g)
    once = [np.array(v, dtype=np.float64) for v in model.gradients()]
    assert all(np.any(v != 0) for v in once)

    # A second backward of the same forward adds the same amount again.
    model.backward(g)
    for a, b in zip(once, model.gradients()):
        np.testing.assert_allclose(b, 2 * a, rtol=1e-5, atol=1e-7)

    # So does a second forward + backward on the same batch.
    out = model.forward(x)
    model.backward(ce.backward(out, labels))
    for a, b in zip(once, model.gradients()):
        np.testing.assert_allclose(b, 3 * a, rtol=1e-5, atol=1e-7)

    views = model.gradients()
    model.zero_grad()
    for v in model.gradients():
        np.testing.assert_array_equal(v, 0.0)
    for v in views:  # gradients() are live views of the buffers
        np.testing.assert_array_equal(v, 0.0)

    out = model.forward(x)
    model.backward(ce.backward(out, labels))
    for a, b in zip(once, model.gradients()):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)

    # The optimizer's zero_grad clears the same buffers.
    cx.SGDOptimizer(0.1).zero_grad(model)
    for v in model.gradients():
        np.testing.assert_array_equal(v, 0.0)


def test_module_backward_accumulates_parameter_gradients_and_zero_grad_resets():
    cx.manual_seed(5)
    layer = cx.LinearModule(3, 2)
    rng = np.random.RandomState(5)
    x1 = rng.standard_normal((4, 3)).astype(np.float32)
    x2 = rng.standard_normal((2, 3)).astype(np.float32)
    g1 = rng.standard_normal((4, 2)).astype(np.float32)
    g2 = rng.standard_normal((2, 2)).astype(np.float32)

    layer.zero_grad()
    layer.forward(x1)
    layer.backward(g1)
    first = [np.array(v, dtype=np.float64) for v in layer.gradients()]
    layer.forward(x2)
    layer.backward(g2)
    # Two different batches accumulate to the gradient of the concatenated batch.
    expected_w = g1.T.astype(np.float64) @ x1 + g2.T.astype(np.float64) @ x2
    expected_b = g1.sum(0).astype(np.float64) + g2.sum(0)
    np.testing.assert_allclose(layer.gradients()[0], expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.gradients()[1], expected_b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(first[0], expected_w)

    layer.zero_grad()
    for v in layer.gradients():
        np.testing.assert_array_equal(v, 0.0)


# --------------------------------------------------------------------------------------------- misuse

def _backward_before_forward_cases():
    return {
        "linear": (lambda: cx.LinearModule(3, 2), (4, 2)),
        "linear_nobias": (lambda: cx.LinearModule(3, 2, bias=False), (4, 2)),
        "relu": (cx.ReLUModule, (4, 3)),
        "sigmoid": (cx.SigmoidModule, (4, 3)),
        "tanh": (cx.TanhModule, (4, 3)),
        "gelu": (cx.GELUModule, (4, 3)),
        "softmax": (cx.SoftmaxModule, (4, 3)),
        "dropout": (lambda: cx.DropoutModule(0.5), (4, 3)),
    }


@pytest.mark.parametrize("name", sorted(_backward_before_forward_cases()))
def test_module_backward_before_forward_raises_value_error(name):
    factory, grad_shape = _backward_before_forward_cases()[name]
    module = factory()
    with pytest.raises(ValueError) as info:
        module.backward(np.ones(grad_shape, dtype=np.float32))
    # The message should say what went wrong (no forward ran), as every module's documented check does.
    assert "forward" in str(info.value), str(info.value)


def test_sequential_backward_before_forward_raises_value_error():
    model = build_mlp(seed=1)
    with pytest.raises(ValueError) as info:
        model.backward(np.ones((2, 4), dtype=np.float32))
    assert "forward" in str(info.value), str(info.value)


@pytest.mark.parametrize("name", ["linear", "relu", "sigmoid", "tanh", "gelu", "softmax"])
def test_backward_with_wrong_gradient_shape_raises_value_error(name):
    module = {
        "linear": lambda: cx.LinearModule(3, 2),
        "relu": cx.ReLUModule,
        "sigmoid": cx.SigmoidModule,
        "tanh": cx.TanhModule,
        "gelu": cx.GELUModule,
        "softmax": cx.SoftmaxModule,
    }[name]()
    y = module.forward(np.ones((4, 3), dtype=np.float32))
    bad = np.ones((y.shape[0] + 1, y.shape[1]), dtype=np.float32)
    with pytest.raises(ValueError) as info:
        module.backward(bad)
    msg = str(info.value)
    assert str(tuple(bad.shape)) in msg and str(tuple(y.shape)) in msg, msg


# --------------------------------------------------------------------------------------------- aliasing
# forward() hands back a fresh numpy array the caller owns and may modify, and takes an input array
# the caller owns; docs/engine.md promises that changing either between forward and backward cannot
# change the gradients. So backward must succeed and return the gradient it returns without the
# change: an error, or a read-only result, breaks that promise too.

@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "softmax"])
def test_mutating_forward_output_does_not_corrupt_backward(name):
    rng = np.random.RandomState(0)
    x = random_away_from_zero(rng, (3, 4))
    g = rng.standard_normal((3, 4)).astype(np.float32)
    module = ACTIVATIONS[name]()
    module.forward(x)
    expected = module.backward(g).copy()

    y = module.forward(x)
    assert y.flags.writeable, f"{name}: forward returned a read-only array, not a fresh buffer the caller owns"
    y[...] = 0.5  # caller reuses the array it was given
    got = module.backward(g)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7,
                               err_msg=f"{name}: backward changed after the caller modified forward's output")


@pytest.mark.parametrize("name", ["linear", "gelu"])
def test_mutating_forward_input_does_not_corrupt_backward(name):
    rng = np.random.RandomState(1)
    cx.manual_seed(1)
    module = cx.LinearModule(4, 3) if name == "linear" else cx.GELUModule()
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y = module.forward(x)
    g = rng.standard_normal(y.shape).astype(np.float32)
    module.zero_grad()
    expected_dx = module.backward(g).copy()
    expected_grads = [v.copy() for v in module.gradients()]

    module.zero_grad()
    module.forward(x)
    x[...] = 3.0  # e.g. a reused batch buffer refilled before backward
    got = module.backward(g)
    np.testing.assert_allclose(got, expected_dx, rtol=1e-6, atol=1e-7,
                               err_msg=f"{name}: input gradient changed after the caller modified the input")
    assert len(module.gradients()) == len(expected_grads)
    for a, b in zip(module.gradients(), expected_grads):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name}: parameter gradient changed after the caller modified the input")
