"""Forward values of every layer and loss against numpy float64 reference implementations, the
torch-like edge cases (huge logits, exact GELU, Linear init), and the errors raised on bad input.

Tolerances: the engine computes in float32 (unit roundoff ~6e-8), so a single transcendental or a
short dot product is good to a few ulps: rtol = 1e-5 with an atol of 1e-6 (for results near zero,
where float32 cancellation such as 1 + erf(-4) loses relative but not absolute accuracy).
"""

import math
import re

import numpy as np
import pytest

import pycyxwiz as cx

RTOL = 1e-5
ATOL = 1e-6

SHAPES = [(1, 1), (1, 6), (5, 3), (2, 3, 4), (7,)]
shape_id = lambda s: "x".join(map(str, s))  # noqa: E731


# --------------------------------------------------------------------------------------------- references

def ref_sigmoid(x):
    x = np.asarray(x, dtype=np.float64)
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def ref_gelu(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def ref_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def ref_log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def ref_cross_entropy(logits, target):
    logp = ref_log_softmax(logits)
    target = np.asarray(target)
    if target.ndim == 1:
        return float(-np.mean(logp[np.arange(len(target)), target.astype(np.int64)]))
    return float(np.mean(-(target.astype(np.float64) * logp).sum(axis=1)))


def ref_cross_entropy_grad(logits, target):
    p = ref_softmax(logits)
    n = logits.shape[0]
    target = np.asarray(target)
    if target.ndim == 1:
        t = np.zeros_like(p)
        t[np.arange(n), target.astype(np.int64)] = 1.0
    else:
        t = target.astype(np.float64)
    return (p * t.sum(axis=1, keepdims=True) - t) / n


ELEMENTWISE = {
    "relu": (cx.ReLUModule, lambda x: np.maximum(np.asarray(x, np.float64), 0.0)),
    "sigmoid": (cx.SigmoidModule, ref_sigmoid),
    "tanh": (cx.TanhModule, lambda x: np.tanh(np.asarray(x, np.float64))),
    "gelu": (cx.GELUModule, ref_gelu),
    "softmax": (cx.SoftmaxModule, ref_softmax),
}


# --------------------------------------------------------------------------------------------- activations

@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_activation_forward_matches_reference(name, shape):
    factory, ref = ELEMENTWISE[name]
    rng = np.random.RandomState(int(np.prod(shape)) + len(name))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    y = factory().forward(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, ref(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_activation_forward_extreme_inputs_are_finite_and_correct(name):
    factory, ref = ELEMENTWISE[name]
    x = np.array([[-1000.0, -100.0, -20.0, -1e-6, 0.0, 1e-6, 20.0, 100.0, 1000.0]], dtype=np.float32)
    y = factory().forward(x)
    assert np.all(np.isfinite(y)), y
    np.testing.assert_allclose(y, ref(x), rtol=RTOL, atol=ATOL)


def test_activation_forward_does_not_modify_input():
    rng = np.random.RandomState(0)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    before = x.copy()
    for factory, _ in ELEMENTWISE.values():
        factory().forward(x)
    np.testing.assert_array_equal(x, before)


def test_gelu_is_exact_erf_form_not_tanh_approximation():
    # The tanh approximation differs from the erf form by up to ~5e-4 around |x| ~ 2; the exact
    # one must be far closer to the erf reference than that.
    x = np.linspace(-4, 4, 801, dtype=np.float32)
    y = cx.GELUModule().forward(x).astype(np.float64)
    x64 = x.astype(np.float64)
    tanh_approx = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    exact = ref_gelu(x)
    assert np.max(np.abs(exact - tanh_approx)) > 1e-4  # the two forms are distinguishable here
    np.testing.assert_allclose(y, exact, rtol=RTOL, atol=ATOL)


def test_softmax_large_logits_are_finite_and_correct():
    x = np.array([[1000.0, 0.0, -1000.0],
                  [1000.0, 1000.0, 999.0],
                  [-1000.0, -1000.0, -1000.0],
                  [88.0, 89.0, 90.0]], dtype=np.float32)
    y = cx.SoftmaxModule().forward(x)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, ref_softmax(x), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-6)


def test_softmax_is_over_last_axis_for_nd_input():
    rng = np.random.RandomState(3)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    y = cx.SoftmaxModule().forward(x)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y, ref_softmax(x), rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------- Linear

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("batch,fin,fout", [(1, 1, 1), (1, 5, 3), (4, 3, 7), (16, 10, 2)])
def test_linear_forward_matches_reference(batch, fin, fout, bias):
    cx.manual_seed(batch + fin + fout)
    layer = cx.LinearModule(fin, fout, bias=bias)
    params = layer.parameters()
    assert params[0].shape == (fout, fin)
    if bias:
        assert len(params) == 2 and params[1].shape == (fout,)
    else:
        assert len(params) == 1
    assert layer.num_parameters() == fin * fout + (fout if bias else 0)
    assert (layer.in_features, layer.out_features, layer.bias) == (fin, fout, bias)

    rng = np.random.RandomState(fin * fout)
    x = rng.standard_normal((batch, fin)).astype(np.float32)
    expected = x.astype(np.float64) @ params[0].astype(np.float64).T
    if bias:
        expected = expected + params[1].astype(np.float64)
    y = layer.forward(x)
    assert y.dtype == np.float32 and y.shape == (batch, fout)
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=1e-5)


def test_linear_parameters_are_writable_views():
    layer = cx.LinearModule(3, 2)
    w, b = layer.parameters()
    w[...] = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]], dtype=np.float32)
    b[...] = np.array([10.0, -10.0], dtype=np.float32)
    x = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]], dtype=np.float32)
    np.testing.assert_allclose(layer.forward(x), x.astype(np.float64) @ w.T.astype(np.float64) + b, rtol=1e-6)
    # A fresh call sees the written values too.
    np.testing.assert_array_equal(layer.parameters()[0], w)


def test_linear_forward_accepts_other_float_and_int_dtypes_like_float32():
    layer = cx.LinearModule(3, 2)
    x32 = np.array([[1.0, -2.0, 3.0]], dtype=np.float32)
    ref = layer.forward(x32)
    np.testing.assert_allclose(layer.forward(x32.astype(np.float64)), ref, rtol=1e-6)
    np.testing.assert_allclose(layer.forward(x32.astype(np.int64)), ref, rtol=1e-6)
    # Non-contiguous input (a transposed view) gives the same result as its contiguous copy.
    xt = np.asfortranarray(np.array([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]], dtype=np.float32))
    np.testing.assert_allclose(layer.forward(xt), layer.forward(np.ascontiguousarray(xt)), rtol=1e-6)


@pytest.mark.parametrize("fin,fout", [(1, 50), (9, 400), (100, 300)])
def test_linear_init_is_uniform_within_inverse_sqrt_fan_in(fin, fout):
    cx.manual_seed(fin)
    w, b = cx.LinearModule(fin, fout).parameters()
    bound = 1.0 / math.sqrt(fin)
    for name, v in (("weight", w), ("bias", b)):
        assert np.all(np.abs(v) <= bound * (1 + 1e-6)), f"{name} outside +-1/sqrt(in_features)"
    # Uniform on [-bound, bound]: mean 0, variance bound^2 / 3, and it fills the interval.
    # With n samples the sample mean has sd bound/sqrt(3n); allow 5 sd.
    n = w.size
    assert abs(float(w.mean())) < 5 * bound / math.sqrt(3 * n)
    assert float(w.var()) == pytest.approx(bound ** 2 / 3, rel=max(0.05, 6 / math.sqrt(n)))
    assert float(np.abs(w).max()) > bound * (1 - 20.0 / n)
    assert len(np.unique(w)) > 0.9 * n  # not a constant or a coarse grid


def test_manual_seed_makes_models_identical_and_different_seeds_differ():
    def build(seed):
        cx.manual_seed(seed)
        model = cx.SequentialModel()
        model.add(cx.LinearModule(6, 8))
        model.add(cx.ReLUModule())
        model.add(cx.LinearModule(8, 3))
        return model

    a, b, c = build(42), build(42), build(43)
    pa, pb, pc = a.parameters(), b.parameters(), c.parameters()
    assert len(pa) == 4
    for x, y in zip(pa, pb):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(pa, pc):
        assert not np.array_equal(x, y)
    # Without reseeding, the next model continues the stream: also different.
    d = cx.LinearModule(6, 8)
    assert not np.array_equal(d.parameters()[0], pa[0])
    # Two models from the same seed compute the same function.
    x = np.random.RandomState(0).standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_array_equal(a.forward(x), b.forward(x))


# --------------------------------------------------------------------------------------------- Dropout

@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_train_statistics_and_scaling(p):
    cx.manual_seed(int(p * 100))
    rng = np.random.RandomState(1)
    n = 200_000
    x = rng.uniform(0.5, 2.0, size=(400, n // 400)).astype(np.float32)
    drop = cx.DropoutModule(p)
    assert drop.p == pytest.approx(p) and drop.training
    y = drop.forward(x)
    zero = y == 0
    # Kept elements are scaled by 1/(1-p) (inverted dropout), dropped ones are exactly 0.
    np.testing.assert_allclose(y[~zero], x[~zero].astype(np.float64) / (1 - p), rtol=1e-6)
    # Drop fraction ~ Binomial(n, p) / n; allow 6 standard deviations.
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(zero.mean() - p) < 6 * sd
    # Expected value preserved: mean(y) ~ mean(x).
    assert float(y.mean()) == pytest.approx(float(x.mean()), rel=0.02)
    # A new mask per forward.
    assert not np.array_equal(drop.forward(x) == 0, zero)


def test_dropout_masks_are_reproducible_with_manual_seed():
    x = np.ones((50, 40), dtype=np.float32)
    drop = cx.DropoutModule(0.5)
    cx.manual_seed(5)
    a = drop.forward(x)
    cx.manual_seed(5)
    b = drop.forward(x)
    cx.manual_seed(6)
    c = drop.forward(x)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_dropout_eval_mode_and_p0_are_identity_and_model_eval_propagates():
    rng = np.random.RandomState(2)
    x = rng.standard_normal((20, 30)).astype(np.float32)
    drop = cx.DropoutModule(0.7)
    drop.eval()
    np.testing.assert_array_equal(drop.forward(x), x)
    np.testing.assert_array_equal(cx.DropoutModule(0.0).forward(x), x)

    model = cx.SequentialModel()
    model.add(cx.DropoutModule(0.7))
    assert model.training
    assert np.count_nonzero(model.forward(x) == 0) > 0
    model.eval()
    assert not model.training and not model[0].training
    np.testing.assert_array_equal(model.forward(x), x)
    model.train()
    assert model[0].training
    assert np.count_nonzero(model.forward(x) == 0) > 0


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_invalid_p_raises(p):
    with pytest.raises(ValueError, match="p"):
        cx.DropoutModule(p)


# --------------------------------------------------------------------------------------------- Sequential

def test_sequential_forward_matches_composed_reference():
    cx.manual_seed(8)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 6))
    model.add(cx.TanhModule())
    model.add(cx.LinearModule(6, 5))
    model.add(cx.GELUModule())
    model.add(cx.LinearModule(5, 3))
    model.add(cx.SoftmaxModule())
    assert len(model) == 6
    w1, b1, w2, b2, w3, b3 = [p.astype(np.float64) for p in model.parameters()]
    assert model.num_parameters() == sum(p.size for p in (w1, b1, w2, b2, w3, b3))
    x = np.random.RandomState(8).standard_normal((7, 4)).astype(np.float32)
    h = np.tanh(x.astype(np.float64) @ w1.T + b1)
    h = ref_gelu(h @ w2.T + b2)
    expected = ref_softmax(h @ w3.T + b3)
    np.testing.assert_allclose(model.forward(x), expected, rtol=1e-5, atol=1e-6)
    # model[i] gives the layers, and running them one by one is the same thing.
    y = x
    for i in range(len(model)):
        y = model[i].forward(y)
    np.testing.assert_allclose(y, model.forward(x), rtol=1e-6, atol=1e-7)
    assert "LinearModule" in model.summary() and str(model.num_parameters()) in model.summary()


@pytest.mark.parametrize("relu_last", [False, True], ids=["relu-inside", "relu-last"])
def test_sequential_linear_relu_fusion_matches_layer_by_layer(relu_last):
    """A LinearModule followed by a ReLUModule runs as one fused call inside a model (not when the
    ReLU is the last layer). Outputs and every gradient must equal running the layers one by one,
    and numpy; exact zeros of the pre-activation must get zero gradient, as ReLU's kink."""
    cx.manual_seed(21)
    layers = [cx.LinearModule(5, 8), cx.ReLUModule(), cx.LinearModule(8, 3, bias=False), cx.ReLUModule(),
              cx.LinearModule(3, 4)]
    if relu_last:
        layers.append(cx.ReLUModule())
    model = cx.SequentialModel()
    for layer in layers:
        model.add(layer)
    rng = np.random.RandomState(21)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    x[0] = 0.0  # row 0: pre-activation = bias of the first layer; zero that bias entry below
    model.parameters()[1][0] = 0.0  # an exact 0 before the first ReLU: the kink
    out = model.forward(x)
    g = rng.standard_normal(out.shape).astype(np.float32)
    model.zero_grad()
    model.backward(g)
    fused_grads = [np.array(a, copy=True) for a in model.gradients()]

    # Layer by layer through the modules' own forward/backward (no fusion there).
    h = [x]
    for layer in layers:
        h.append(np.asarray(layer.forward(h[-1])))
    np.testing.assert_array_equal(out, h[-1])
    model.zero_grad()
    d = g
    for i in reversed(range(len(layers))):
        d = layers[i].backward(d)
    for fused, plain in zip(fused_grads, model.gradients()):
        np.testing.assert_array_equal(fused, plain)

    # numpy, in float64.
    params = [p.astype(np.float64) for p in model.parameters()]
    w1, b1, w2, w3, b3 = params
    z1 = x.astype(np.float64) @ w1.T + b1
    a1 = np.maximum(z1, 0)
    z2 = a1 @ w2.T
    a2 = np.maximum(z2, 0)
    z3 = a2 @ w3.T + b3
    ref = np.maximum(z3, 0) if relu_last else z3
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    d3 = g.astype(np.float64) * (z3 > 0) if relu_last else g.astype(np.float64)
    d1 = (d3 @ w3 * (z2 > 0)) @ w2 * (z1 > 0)
    assert z1[0, 0] == 0.0 and d1[0, 0] == 0.0
    np.testing.assert_allclose(fused_grads[1], d1.sum(axis=0), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------- losses

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", INT_DTYPES + [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch,classes", [(1, 2), (5, 3), (32, 10)])
def test_cross_entropy_forward_and_backward_match_reference_for_label_dtypes(batch, classes, dtype):
    rng = np.random.RandomState(batch * classes)
    logits = (rng.standard_normal((batch, classes)) * 3).astype(np.float32)
    labels = rng.randint(0, classes, size=batch)
    ce = cx.CrossEntropyLoss()
    target = labels.astype(dtype)
    loss = ce.forward(logits, target)
    assert isinstance(loss, float)
    assert loss == pytest.approx(ref_cross_entropy(logits, labels), rel=1e-6, abs=1e-7)
    assert ce(logits, target) == loss
    np.testing.assert_allclose(ce.backward(logits, target), ref_cross_entropy_grad(logits, labels),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["one_hot", "probabilities", "unnormalised"])
def test_cross_entropy_row_targets_match_reference(kind):
    rng = np.random.RandomState(4)
    logits = (rng.standard_normal((6, 4)) * 2).astype(np.float32)
    labels = rng.randint(0, 4, size=6)
    if kind == "one_hot":
        target = np.eye(4, dtype=np.float32)[labels]
    elif kind == "probabilities":
        target = rng.dirichlet(np.ones(4), size=6).astype(np.float32)
    else:
        target = rng.uniform(0, 3, size=(6, 4)).astype(np.float32)
    ce = cx.CrossEntropyLoss()
    assert ce.forward(logits, target) == pytest.approx(ref_cross_entropy(logits, target), rel=1e-6)
    np.testing.assert_allclose(ce.backward(logits, target), ref_cross_entropy_grad(logits, target),
                               rtol=1e-5, atol=1e-7)
    if kind == "one_hot":
        assert ce.forward(logits, target) == pytest.approx(ce.forward(logits, labels), rel=1e-7)


def test_cross_entropy_huge_logits_are_finite_and_correct():
    logits = np.array([[1000.0, -1000.0], [1000.0, -1000.0], [-1000.0, 1000.0], [500.0, 500.0]], dtype=np.float32)
    labels = np.array([0, 1, 0, 1])
    ce = cx.CrossEntropyLoss()
    # Per row: 0, 2000, 2000, log 2.
    per_row = [ce.forward(logits[i:i + 1], labels[i:i + 1]) for i in range(4)]
    assert all(math.isfinite(v) for v in per_row)
    expected_rows = [ref_cross_entropy(logits[i:i + 1], labels[i:i + 1]) for i in range(4)]
    np.testing.assert_allclose(per_row, expected_rows, rtol=1e-6, atol=1e-6)
    loss = ce.forward(logits, labels)
    assert math.isfinite(loss) and loss == pytest.approx(ref_cross_entropy(logits, labels), rel=1e-6)
    grad = ce.backward(logits, labels)
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, ref_cross_entropy_grad(logits, labels), rtol=1e-5, atol=1e-7)
    # The same through probability rows.
    onehot = np.eye(2, dtype=np.float32)[labels]
    assert ce.forward(logits, onehot) == pytest.approx(loss, rel=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (4, 3), (2, 3, 4), (9,)], ids=shape_id)
def test_mse_forward_and_backward_match_reference(shape):
    rng = np.random.RandomState(int(np.prod(shape)))
    out = rng.standard_normal(shape).astype(np.float32)
    tgt = rng.standard_normal(shape).astype(np.float32)
    mse = cx.MSELoss()
    d = out.astype(np.float64) - tgt.astype(np.float64)
    assert mse.forward(out, tgt) == pytest.approx(float(np.mean(d * d)), rel=1e-6)
    np.testing.assert_allclose(mse.backward(out, tgt), 2 * d / d.size, rtol=1e-5, atol=1e-7)


def test_mse_shape_mismatch_raises():
    with pytest.raises(ValueError):
        cx.MSELoss().forward(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))


def test_accuracy_matches_numpy_argmax():
    rng = np.random.RandomState(9)
    out = rng.standard_normal((200, 5)).astype(np.float32)
    labels = rng.randint(0, 5, size=200)
    expected = float(np.mean(out.argmax(axis=1) == labels))
    assert 0 < expected < 1
    assert cx.accuracy(out, labels) == pytest.approx(expected)
    assert cx.accuracy(out, labels.astype(np.int32)) == pytest.approx(expected)
    assert cx.accuracy(out, np.eye(5, dtype=np.float32)[labels]) == pytest.approx(expected)
    assert cx.accuracy(out, out.argmax(axis=1)) == 1.0


# --------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad_shape", [(3, 7), (1, 4), (2, 6)])
def test_linear_wrong_feature_count_names_expected_and_actual_shape(bad_shape):
    layer = cx.LinearModule(5, 2)
    with pytest.raises(ValueError) as info:
        layer.forward(np.zeros(bad_shape, dtype=np.float32))
    msg = str(info.value)
    assert str(bad_shape) in msg, msg  # actual shape, e.g. "(3, 7)"
    assert re.search(r"\([^()]*\b5\)", msg), msg  # expected shape, e.g. "(batch, 5)"


def test_sequential_wrong_feature_count_raises_value_error_naming_shapes():
    model = cx.SequentialModel()
    model.add(cx.LinearModule(5, 3))
    model.add(cx.ReLUModule())
    with pytest.raises(ValueError) as info:
        model.forward(np.zeros((4, 8), dtype=np.float32))
    msg = str(info.value)
    assert "(4, 8)" in msg and re.search(r"\([^()]*\b5\)", msg), msg


@pytest.mark.parametrize("x_shape", [(5,), (2, 3, 4)], ids=["1d", "3d-wrong-width"])
def test_linear_rejects_input_without_its_last_dimension(x_shape):
    with pytest.raises(ValueError) as info:
        cx.LinearModule(5, 2).forward(np.zeros(x_shape, dtype=np.float32))
    assert str(x_shape).replace(",)", ")") in str(info.value) or str(x_shape) in str(info.value)


def test_linear_acts_on_the_last_dimension_of_3d_input():
    """As torch.nn.Linear: (N, T, in) -> (N, T, out), each (n, t) row its own product."""
    layer = cx.LinearModule(5, 2)
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(layer.forward(x), layer.forward(x.reshape(6, 5)).reshape(2, 3, 2))


def test_adding_mismatched_linear_layers_raises():
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 6))
    with pytest.raises(ValueError):
        model.add(cx.LinearModule(5, 2))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bad", [3, 7, 100])
def test_cross_entropy_out_of_range_label_names_the_label(bad, dtype):
    logits = np.zeros((3, 3), dtype=np.float32)
    target = np.array([0, bad, 1], dtype=dtype)
    ce = cx.CrossEntropyLoss()
    for call in (ce.forward, ce.backward, cx.accuracy):
        with pytest.raises(ValueError) as info:
            call(logits, target)
        assert re.search(rf"(?<![\d.]){bad}(?![\d])", str(info.value)), str(info.value)


@pytest.mark.parametrize("dtype", [np.int8, np.int64], ids=["int8", "int64"])
def test_cross_entropy_negative_label_names_the_label(dtype):
    ce = cx.CrossEntropyLoss()
    with pytest.raises(ValueError) as info:
        ce.forward(np.zeros((2, 4), np.float32), np.array([1, -2], dtype=dtype))
    assert "-2" in str(info.value), str(info.value)


def test_cross_entropy_huge_unsigned_label_names_the_label():
    # 2**64 - 1 does not fit int64; the error must still name the label the caller passed, not
    # what it turned into after a wrapping cast.
    big = np.iinfo(np.uint64).max
    ce = cx.CrossEntropyLoss()
    with pytest.raises(ValueError) as info:
        ce.forward(np.zeros((2, 4), np.float32), np.array([1, big], dtype=np.uint64))
    assert str(big) in str(info.value), str(info.value)


@pytest.mark.parametrize("bad", [0.5, 1.25, -0.5, float("nan"), float("inf"), 1e20])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_cross_entropy_non_integral_or_unusable_float_labels_raise(bad, dtype):
    ce = cx.CrossEntropyLoss()
    target = np.array([0, bad, 1], dtype=dtype)
    for call in (ce.forward, ce.backward, cx.accuracy):
        with pytest.raises(ValueError):
            call(np.zeros((3, 3), np.float32), target)


def test_cross_entropy_non_integral_label_message_names_the_value():
    with pytest.raises(ValueError) as info:
        cx.CrossEntropyLoss().forward(np.zeros((2, 3), np.float32), np.array([1.0, 1.5]))
    assert "1.5" in str(info.value), str(info.value)


def test_cross_entropy_label_count_mismatch_raises():
    with pytest.raises(ValueError):
        cx.CrossEntropyLoss().forward(np.zeros((3, 3), np.float32), np.array([0, 1]))
