"""The engine's own CPU loops split over the threads cx.set_num_threads gives (common/parallel.h): row loops
by rows, column sums (a bias's or LayerNorm's parameter gradients) by columns, each column summed over the
rows in order, a loss's row terms summed in row order after the threads. So a layer gives the same bits
at any thread count. Oracle: the same layer and inputs at one thread; the shapes are large enough that
every loop splits at two (about 16K values a task).
"""

import numpy as np
import pytest

import pycyxwiz as cx


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def at_threads(threads, fn):
    before = cx.get_num_threads()
    try:
        cx.set_num_threads(threads)
        return fn()
    finally:
        cx.set_num_threads(before)


def module_pass(make, x, seed):
    """forward, input gradient and parameter gradients of a fresh module (seeded) on x."""
    def run():
        cx.manual_seed(seed)
        m = make()
        y = m.forward(x)
        g = rand(*y.shape, seed=seed + 1)
        m.zero_grad()
        dx = m.backward(g)
        return [y, dx] + [np.array(p) for p in m.gradients()]
    return run


# (layer, input shape, which results: 0 output, 1 input gradient, 2.. parameter gradients). The linear
# layer's output, input and weight gradients are OpenBLAS's products, whose bits may depend on its thread
# count: only its bias gradient (our column sums) is compared.
@pytest.mark.parametrize("make,shape,which", [
    (lambda: cx.LayerNormModule(128), (8, 128, 128), [0, 1, 2, 3]),
    (lambda: cx.LinearModule(64, 256), (16, 64, 64), [3]),
    (lambda: cx.SoftmaxModule(), (1024, 256), [0, 1]),
    (lambda: cx.PositionalEncodingModule(128, 128, learned=True), (64, 128, 128), [0, 1, 2]),
], ids=["layernorm", "linear-bias", "softmax", "positional"])
def test_a_layer_gives_the_same_bits_at_one_and_two_threads(make, shape, which):
    x = rand(*shape, seed=3)
    one, two = at_threads(1, module_pass(make, x, 5)), at_threads(2, module_pass(make, x, 5))
    for i in which:
        np.testing.assert_array_equal(one[i], two[i], err_msg=f"result {i} differs between one and two threads")
        assert np.any(one[i]), f"result {i} is all zero: nothing was compared"


@pytest.mark.parametrize("target", ["indices", "ignored", "probabilities"])
def test_cross_entropy_gives_the_same_bits_at_one_and_two_threads(target):
    logits = rand(16, 64, 256, seed=7)
    rng = np.random.default_rng(8)
    if target == "probabilities":
        p = rng.random((16 * 64, 256)).astype(np.float32)
        y = (p / p.sum(axis=1, keepdims=True)).reshape(16, 64, 256)
    else:
        y = rng.integers(0, 256, (16, 64))
        if target == "ignored":
            y[:, ::3] = -100
    def run():
        loss = cx.CrossEntropyLoss()
        return loss.forward(logits, y), loss.backward(logits, y)
    (l1, g1), (l2, g2) = at_threads(1, run), at_threads(2, run)
    assert l1 == l2, (l1, l2)
    np.testing.assert_array_equal(g1, g2)
    # and right: numpy's log-softmax in float64
    flat = logits.reshape(-1, 256).astype(np.float64)
    logp = flat - flat.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    if target == "probabilities":
        want = -(y.reshape(-1, 256) * logp).sum(axis=1).mean()
    else:
        keep = y.reshape(-1) != -100
        want = -logp[keep, y.reshape(-1)[keep]].mean()
    assert abs(l1 - want) <= 1e-5 * abs(want), (l1, want)
