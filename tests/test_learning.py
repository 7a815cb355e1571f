"""End to end: small models trained with the engine's own forward/backward/optimizers learn real tasks.

The tasks are synthetic but not trivial for an untrained model: Gaussian blobs whose classes a
nearest-centroid rule separates almost perfectly (checked below, so the accuracy bar is achievable),
while an untrained network sits near chance. Held-out accuracy is the oracle.
"""

import time

import numpy as np
import pytest

import pycyxwiz as cx

FEATURES = 8
CLASSES = 4


def make_blobs(n, seed, features=FEATURES, classes=CLASSES, spread=1.5):
    rng = np.random.RandomState(seed)
    centers = np.random.RandomState(12345).normal(0.0, 2.5, size=(classes, features))  # same task for every split
    y = rng.randint(0, classes, size=n)
    x = centers[y] + rng.normal(0.0, spread, size=(n, features))
    return x.astype(np.float32), y.astype(np.int64), centers


@pytest.fixture(scope="module")
def blobs():
    x_train, y_train, centers = make_blobs(1200, seed=1)
    x_test, y_test, _ = make_blobs(600, seed=2)
    # The task is learnable but the classes overlap a little: the (Bayes-optimal, equal-covariance)
    # nearest-centroid rule gets ~99.5% of the test set, so a 95% bar is reachable but not free.
    d = ((x_test[:, None, :].astype(np.float64) - centers[None]) ** 2).sum(-1)
    assert 0.98 < np.mean(d.argmin(1) == y_test) < 1.0
    return x_train, y_train, x_test, y_test


def build_mlp(seed, hidden=32, dropout=None):
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(FEATURES, hidden))
    model.add(cx.ReLUModule())
    if dropout is not None:
        model.add(cx.DropoutModule(dropout))
    model.add(cx.LinearModule(hidden, CLASSES))
    return model


def full_loss(model, loss_fn, x, y):
    was_training = model.training
    model.eval()
    value = loss_fn.forward(model.forward(x), y)
    if was_training:
        model.train()
    return value


def evaluate(model, x, y):
    model.eval()
    out = model.forward(x)
    model.train()
    acc = cx.accuracy(out, y)
    # Cross-check the engine's accuracy helper against numpy.
    assert acc == pytest.approx(float(np.mean(out.argmax(1) == y)))
    return acc


def train(model, optimizer, x, y, epochs, batch_size=32, seed=0):
    loss_fn = cx.CrossEntropyLoss()
    rng = np.random.RandomState(seed)
    epoch_losses = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        losses = []
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            optimizer.zero_grad(model)
            out = model.forward(x[idx])
            losses.append(loss_fn.forward(out, y[idx]))
            model.backward(loss_fn.backward(out, y[idx]))
            optimizer.step(model)
        epoch_losses.append(float(np.mean(losses)))
    return epoch_losses


OPTIMIZERS = {
    "adam": lambda: cx.AdamOptimizer(0.01),
    "adamw": lambda: cx.AdamWOptimizer(0.01, weight_decay=0.01),
    "sgd_momentum": lambda: cx.SGDOptimizer(0.05, momentum=0.9),
    "sgd_nesterov": lambda: cx.SGDOptimizer(0.05, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_learns_gaussian_blobs(blobs, name):
    x_train, y_train, x_test, y_test = blobs
    model = build_mlp(seed=0)
    loss_fn = cx.CrossEntropyLoss()
    initial_loss = full_loss(model, loss_fn, x_train, y_train)
    initial_acc = evaluate(model, x_test, y_test)
    assert initial_acc < 0.9, "an untrained model already solves the task; the test would prove nothing"

    start = time.perf_counter()
    epoch_losses = train(model, OPTIMIZERS[name](), x_train, y_train, epochs=10)
    elapsed = time.perf_counter() - start

    final_loss = full_loss(model, loss_fn, x_train, y_train)
    test_acc = evaluate(model, x_test, y_test)
    assert all(np.isfinite(epoch_losses))
    assert final_loss < 0.25 * initial_loss, (initial_loss, final_loss)
    assert epoch_losses[-1] < 0.5 * epoch_losses[0], epoch_losses
    assert test_acc > 0.95, (test_acc, epoch_losses)
    assert elapsed < 5.0


def xor_blobs(n, seed):
    """Four blobs at (+-2, +-2); the class is the XOR of the two signs: not linearly separable."""
    rng = np.random.RandomState(seed)
    quadrant = rng.randint(0, 4, size=n)
    sx = np.where(quadrant & 1, 1.0, -1.0)
    sy = np.where(quadrant & 2, 1.0, -1.0)
    x = np.stack([sx, sy], axis=1) * 2.0 + rng.normal(0.0, 0.5, size=(n, 2))
    y = ((sx > 0) != (sy > 0)).astype(np.int64)
    return x.astype(np.float32), y


def test_hidden_layer_is_needed_and_learned_for_xor_blobs():
    # A linear model cannot do better than ~75% here, so passing needs a working backward through
    # the ReLU hidden layer, not just through the last linear layer.
    x_train, y_train = xor_blobs(800, seed=1)
    x_test, y_test = xor_blobs(400, seed=2)

    cx.manual_seed(0)
    linear = cx.SequentialModel()
    linear.add(cx.LinearModule(2, 2))
    train(linear, cx.AdamOptimizer(0.01), x_train, y_train, epochs=15)
    assert evaluate(linear, x_test, y_test) < 0.8

    cx.manual_seed(0)
    mlp = cx.SequentialModel()
    mlp.add(cx.LinearModule(2, 16))
    mlp.add(cx.ReLUModule())
    mlp.add(cx.LinearModule(16, 2))
    losses = train(mlp, cx.AdamOptimizer(0.01), x_train, y_train, epochs=15)
    assert losses[-1] < 0.1 * losses[0], losses
    assert evaluate(mlp, x_test, y_test) > 0.95


def test_first_steps_decrease_the_batch_loss():
    # Gradient descent with a small step on a fixed batch must lower that batch's loss step by step:
    # this fails if the gradients point the wrong way or the optimizer applies them with the wrong sign.
    x_train, y_train, _ = make_blobs(64, seed=5)
    model = build_mlp(seed=3)
    loss_fn = cx.CrossEntropyLoss()
    opt = cx.SGDOptimizer(0.05)
    losses = []
    for _ in range(20):
        opt.zero_grad(model)
        out = model.forward(x_train)
        losses.append(loss_fn.forward(out, y_train))
        model.backward(loss_fn.backward(out, y_train))
        opt.step(model)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_mlp_with_dropout_learns_and_eval_is_deterministic(blobs):
    x_train, y_train, x_test, y_test = blobs
    model = build_mlp(seed=1, hidden=48, dropout=0.2)
    train(model, cx.AdamOptimizer(0.01), x_train, y_train, epochs=10)
    model.eval()
    a = model.forward(x_test)
    b = model.forward(x_test)
    np.testing.assert_array_equal(a, b)
    assert cx.accuracy(a, y_test) > 0.95


def test_linear_regression_with_mse_recovers_least_squares_solution():
    rng = np.random.RandomState(7)
    n, d = 512, 5
    x = rng.standard_normal((n, d)).astype(np.float32)
    w_true = rng.uniform(-2, 2, size=(1, d))
    b_true = 0.7
    y = (x.astype(np.float64) @ w_true.T + b_true + 0.05 * rng.standard_normal((n, 1))).astype(np.float32)

    # Oracle: ordinary least squares in float64.
    design = np.hstack([x.astype(np.float64), np.ones((n, 1))])
    coef, *_ = np.linalg.lstsq(design, y.astype(np.float64), rcond=None)

    cx.manual_seed(0)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(d, 1))
    mse = cx.MSELoss()
    opt = cx.SGDOptimizer(0.1, momentum=0.5)
    for _ in range(300):  # full-batch gradient descent on a well-conditioned problem
        opt.zero_grad(model)
        out = model.forward(x)
        model.backward(mse.backward(out, y))
        opt.step(model)
    w, b = model.parameters()
    np.testing.assert_allclose(w.ravel(), coef[:d, 0], atol=1e-3)
    assert float(b[0]) == pytest.approx(coef[d, 0], abs=1e-3)
    residual = float(np.mean((design @ coef - y) ** 2))
    assert mse.forward(model.forward(x), y) == pytest.approx(residual, rel=1e-3)
