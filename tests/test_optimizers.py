"""Optimizers against their update formulas.

Each engine optimizer (float32) is checked step by step against a float64 numpy oracle that is fed
the same parameters and the same gradients (from a real forward/backward on a small model) and that
carries its own state (momentum buffer, Adam moments, step count for the bias correction). When
torch is importable the same sequences are also checked against torch.optim.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pycyxwiz as cx

RTOL = 1e-5
ATOL = 1e-6


# --------------------------------------------------------------------------------------------- helpers


def make_model(seed=0):
    """Linear (bias) -> Tanh -> Linear (no bias) -> ReLU -> Linear (bias): 5 parameter tensors."""
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(5, 7))
    model.add(cx.TanhModule())
    model.add(cx.LinearModule(7, 6, bias=False))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(6, 3))
    return model


def make_other_model(seed=1):
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 2))
    return model


def copy_weights(src, dst):
    for s, d in zip(src.parameters(), dst.parameters()):
        d[...] = s


def make_batches(n_steps, seed=123, batch=8, features=5, classes=3):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(batch, features)).astype(np.float32), rng.integers(0, classes, size=batch))
        for _ in range(n_steps)
    ]


def compute_grads(model, x, y):
    """Fresh gradients of the mean cross-entropy at the model's current parameters."""
    loss_fn = cx.CrossEntropyLoss()
    model.zero_grad()
    out = model.forward(x)
    model.backward(loss_fn.backward(out, y))


def snapshot(model):
    return [p.copy() for p in model.parameters()], [g.copy() for g in model.gradients()]


class SGDOracle:
    """torch.optim.SGD with dampening 0, in float64."""

    def __init__(self, lr, momentum=0.0, weight_decay=0.0, nesterov=False):
        self.lr, self.momentum, self.wd, self.nesterov = lr, momentum, weight_decay, nesterov
        self.bufs = None
        self.t = 0

    def step(self, params, grads):
        params = [p.astype(np.float64) for p in params]
        grads = [g.astype(np.float64) for g in grads]
        if self.momentum > 0 and self.bufs is None:
            self.bufs = [np.zeros_like(p) for p in params]
        self.t += 1
        out = []
        for i, (p, g) in enumerate(zip(params, grads)):
            g = g + self.wd * p
            if self.momentum > 0:
                if self.t == 1:
                    self.bufs[i] = g.copy()
                else:
                    self.bufs[i] = self.momentum * self.bufs[i] + g
                g = g + self.momentum * self.bufs[i] if self.nesterov else self.bufs[i]
            out.append(p - self.lr * g)
        return out

    def buffers(self):
        return {} if self.bufs is None else {f"momentum_buffer.{i}": b for i, b in enumerate(self.bufs)}


class AdamOracle:
    """torch.optim.Adam (L2 in the gradient) or AdamW (decoupled decay), amsgrad off, in float64."""

    def __init__(self, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
        self.decoupled = decoupled
        self.m = self.v = None
        self.t = 0

    def step(self, params, grads):
        params = [p.astype(np.float64) for p in params]
        grads = [g.astype(np.float64) for g in grads]
        if self.m is None:
            self.m = [np.zeros_like(p) for p in params]
            self.v = [np.zeros_like(p) for p in params]
        self.t += 1
        bc1 = 1.0 - self.b1 ** self.t
        bc2 = 1.0 - self.b2 ** self.t
        out = []
        for i, (p, g) in enumerate(zip(params, grads)):
            if self.decoupled:
                p = p * (1.0 - self.lr * self.wd)
            else:
                g = g + self.wd * p
            self.m[i] = self.b1 * self.m[i] + (1.0 - self.b1) * g
            self.v[i] = self.b2 * self.v[i] + (1.0 - self.b2) * g * g
            denom = np.sqrt(self.v[i]) / np.sqrt(bc2) + self.eps
            out.append(p - (self.lr / bc1) * self.m[i] / denom)
        return out

    def buffers(self):
        if self.m is None:
            return {}
        out = {f"exp_avg.{i}": m for i, m in enumerate(self.m)}
        out.update({f"exp_avg_sq.{i}": v for i, v in enumerate(self.v)})
        return out


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.05, weight_decay=0.01),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.1, momentum=0.9, weight_decay=0.05),
    dict(lr=0.1, momentum=0.9, nesterov=True),
    dict(lr=0.2, momentum=0.5, weight_decay=0.1, nesterov=True),
]

ADAM_CASES = [
    dict(lr=0.01),
    dict(lr=0.01, weight_decay=0.1),
    dict(lr=0.05, beta1=0.5, beta2=0.9, eps=1e-3),
    dict(lr=0.02, beta1=0.0, beta2=0.99, eps=1e-6, weight_decay=0.3),
]

ADAMW_CASES = [
    dict(lr=0.01),  # default weight_decay=0.01
    dict(lr=0.01, weight_decay=0.0),
    dict(lr=0.05, weight_decay=0.5),
    dict(lr=0.02, beta1=0.8, beta2=0.95, eps=1e-4, weight_decay=0.2),
]


def engine_and_oracle(kind, kwargs):
    if kind == "sgd":
        return cx.SGDOptimizer(**kwargs), SGDOracle(**kwargs)
    if kind == "adam":
        return cx.AdamOptimizer(**kwargs), AdamOracle(**kwargs)
    kw = dict(kwargs)
    kw.setdefault("weight_decay", 0.01)  # AdamW's documented default
    return cx.AdamWOptimizer(**kwargs), AdamOracle(decoupled=True, **kw)


ALL_CASES = (
    [pytest.param("sgd", kw, id=f"sgd-{i}") for i, kw in enumerate(SGD_CASES)]
    + [pytest.param("adam", kw, id=f"adam-{i}") for i, kw in enumerate(ADAM_CASES)]
    + [pytest.param("adamw", kw, id=f"adamw-{i}") for i, kw in enumerate(ADAMW_CASES)]
)


def run_against_oracle(opt, oracle, model, batches, lr_schedule=None):
    """Steps engine and oracle together; the oracle gets the engine's params and grads before each step."""
    for step, (x, y) in enumerate(batches):
        if lr_schedule is not None and step in lr_schedule:
            opt.learning_rate = lr_schedule[step]
            oracle.lr = lr_schedule[step]
        compute_grads(model, x, y)
        params, grads = snapshot(model)
        assert any(np.any(g != 0) for g in grads), "the batch produced no gradient"
        expected = oracle.step(params, grads)
        opt.step(model)
        assert opt.step_count == step + 1
        after = model.parameters()
        for i, (a, e, before) in enumerate(zip(after, expected, params)):
            assert a.dtype == np.float32
            np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"step {step + 1}, parameter {i}")
        # The step moved something (so a no-op optimizer cannot pass).
        assert any(not np.array_equal(a, b) for a, b in zip(after, params))


# --------------------------------------------------------------------------------------- the oracles


@pytest.mark.parametrize("kind,kwargs", ALL_CASES)
def test_update_matches_numpy_formula_over_several_steps(kind, kwargs):
    model = make_model()
    opt, oracle = engine_and_oracle(kind, kwargs)
    run_against_oracle(opt, oracle, model, make_batches(6))
    # The carried state matches the oracle's buffers too.
    state = opt.state_dict()
    expected_buffers = oracle.buffers()
    tensor_keys = {k for k, v in state.items() if isinstance(v, np.ndarray)}
    assert tensor_keys == set(expected_buffers)
    for key, value in expected_buffers.items():
        assert state[key].dtype == np.float32
        assert state[key].shape == value.shape
        np.testing.assert_allclose(state[key], value, rtol=RTOL, atol=ATOL, err_msg=key)


def test_sgd_plain_single_step_exact_formula():
    # p -= lr * g, computed in float32 by the engine: compare with float32 arithmetic exactly-ish.
    model = make_model()
    x, y = make_batches(1)[0]
    compute_grads(model, x, y)
    params, grads = snapshot(model)
    cx.SGDOptimizer(0.5).step(model)
    for a, p, g in zip(model.parameters(), params, grads):
        np.testing.assert_allclose(a, p - np.float32(0.5) * g, rtol=1e-6, atol=1e-7)


def test_adam_first_step_moves_each_coordinate_by_about_lr():
    # With bias correction, step 1 is p -= lr * g / (|g| + eps'): every coordinate with a gradient moves by ~lr.
    model = make_model()
    x, y = make_batches(1)[0]
    compute_grads(model, x, y)
    params, grads = snapshot(model)
    cx.AdamOptimizer(lr=0.01).step(model)
    for a, p, g in zip(model.parameters(), params, grads):
        big = np.abs(g) > 1e-4
        assert big.any()
        np.testing.assert_allclose((p - a)[big], 0.01 * np.sign(g[big]), rtol=1e-3)


def test_adam_and_adamw_differ_only_through_weight_decay():
    batches = make_batches(3)
    results = {}
    for name, opt in [
        ("adam_nowd", cx.AdamOptimizer(lr=0.01, weight_decay=0.0)),
        ("adamw_nowd", cx.AdamWOptimizer(lr=0.01, weight_decay=0.0)),
        ("adam_wd", cx.AdamOptimizer(lr=0.01, weight_decay=0.5)),
        ("adamw_wd", cx.AdamWOptimizer(lr=0.01, weight_decay=0.5)),
    ]:
        model = make_model()
        for x, y in batches:
            compute_grads(model, x, y)
            opt.step(model)
        results[name] = model.parameters()
    for a, b in zip(results["adam_nowd"], results["adamw_nowd"]):
        assert np.array_equal(a, b)
    assert any(not np.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(results["adam_wd"], results["adamw_wd"]))


def test_adamw_decay_is_applied_even_with_zero_gradient():
    # Decoupled decay: p *= 1 - lr*wd regardless of the gradient; Adam's L2 with g=0 gives m=wd*p instead.
    model = make_model()
    model.zero_grad()
    params = [p.copy() for p in model.parameters()]
    cx.AdamWOptimizer(lr=0.1, weight_decay=0.5).step(model)
    for a, p in zip(model.parameters(), params):
        np.testing.assert_allclose(a, p * (1 - 0.1 * 0.5), rtol=1e-6, atol=1e-7)


def test_zero_lr_leaves_parameters_unchanged():
    for opt in [cx.SGDOptimizer(0.0, momentum=0.9, weight_decay=0.1), cx.AdamOptimizer(0.0, weight_decay=0.1),
                cx.AdamWOptimizer(0.0, weight_decay=0.1)]:
        model = make_model()
        x, y = make_batches(1)[0]
        compute_grads(model, x, y)
        params, _ = snapshot(model)
        opt.step(model)
        for a, p in zip(model.parameters(), params):
            assert np.array_equal(a, p), repr(opt)
        assert opt.step_count == 1


def test_gradients_are_not_consumed_by_step_and_zero_grad_clears_them():
    model = make_model()
    x, y = make_batches(1)[0]
    compute_grads(model, x, y)
    _, grads = snapshot(model)
    opt = cx.SGDOptimizer(0.1, momentum=0.9)
    opt.step(model)
    for g_after, g in zip(model.gradients(), grads):
        assert np.array_equal(g_after, g)
    opt.zero_grad(model)
    for g in model.gradients():
        assert g.shape and not np.any(g)


# ------------------------------------------------------------------------------------- learning rate


@pytest.mark.parametrize("kind,kwargs", [ALL_CASES[3], ALL_CASES[7], ALL_CASES[12]])
def test_learning_rate_setter_takes_effect(kind, kwargs):
    model = make_model()
    opt, oracle = engine_and_oracle(kind, kwargs)
    assert opt.learning_rate == pytest.approx(kwargs["lr"])
    run_against_oracle(opt, oracle, model, make_batches(6), lr_schedule={2: 0.003, 4: 0.05})
    assert opt.learning_rate == 0.05
    assert opt.state_dict()["lr"] == 0.05


@pytest.mark.parametrize("make", [lambda: cx.SGDOptimizer(0.1), lambda: cx.AdamOptimizer(), lambda: cx.AdamWOptimizer()])
@pytest.mark.parametrize("bad", [-0.1, -1e-12, float("nan"), float("-inf")])
def test_negative_learning_rate_is_rejected_and_old_value_kept(make, bad):
    opt = make()
    old = opt.learning_rate
    with pytest.raises(ValueError, match="learning_rate"):
        opt.learning_rate = bad
    assert opt.learning_rate == old


def test_step_count_is_read_only():
    opt = cx.SGDOptimizer(0.1)
    with pytest.raises(AttributeError):
        opt.step_count = 5
    assert opt.step_count == 0


# ------------------------------------------------------------------------------- invalid hyper-params


@pytest.mark.parametrize(
    "factory,name",
    [
        (lambda: cx.SGDOptimizer(-0.1), "learning_rate"),
        (lambda: cx.SGDOptimizer(0.1, momentum=-0.5), "momentum"),
        (lambda: cx.SGDOptimizer(0.1, weight_decay=-1e-4), "weight_decay"),
        (lambda: cx.SGDOptimizer(0.1, momentum=0.0, nesterov=True), "nesterov"),
        (lambda: cx.SGDOptimizer(float("nan")), "learning_rate"),
        (lambda: cx.AdamOptimizer(lr=-1e-3), "learning_rate"),
        (lambda: cx.AdamOptimizer(beta1=1.0), "beta1"),
        (lambda: cx.AdamOptimizer(beta1=-0.1), "beta1"),
        (lambda: cx.AdamOptimizer(beta2=1.0), "beta2"),
        (lambda: cx.AdamOptimizer(beta2=1.5), "beta2"),
        (lambda: cx.AdamOptimizer(beta2=float("nan")), "beta2"),
        (lambda: cx.AdamOptimizer(eps=-1e-8), "eps"),
        (lambda: cx.AdamOptimizer(weight_decay=-0.1), "weight_decay"),
        (lambda: cx.AdamWOptimizer(lr=-1.0), "learning_rate"),
        (lambda: cx.AdamWOptimizer(beta1=1.0), "beta1"),
        (lambda: cx.AdamWOptimizer(beta2=-0.5), "beta2"),
        (lambda: cx.AdamWOptimizer(eps=-1.0), "eps"),
        (lambda: cx.AdamWOptimizer(weight_decay=-0.01), "weight_decay"),
    ],
)
def test_invalid_hyper_parameters_raise_value_error(factory, name):
    with pytest.raises(ValueError, match=name):
        factory()


def test_state_dict_scalars_report_hyper_parameters():
    sgd = cx.SGDOptimizer(0.25, momentum=0.75, weight_decay=0.125, nesterov=True).state_dict()
    assert sgd == {"step": 0.0, "lr": 0.25, "momentum": 0.75, "weight_decay": 0.125, "nesterov": 1.0}
    adam = cx.AdamOptimizer(lr=0.5, beta1=0.25, beta2=0.75, eps=0.125, weight_decay=0.0625).state_dict()
    assert adam == {"step": 0.0, "lr": 0.5, "beta1": 0.25, "beta2": 0.75, "eps": 0.125, "weight_decay": 0.0625}
    adamw = cx.AdamWOptimizer().state_dict()
    assert adamw == {"step": 0.0, "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    for value in list(sgd.values()) + list(adam.values()):
        assert isinstance(value, float)


# ------------------------------------------------------------------------------------ state_dict I/O


STATEFUL_CASES = [ALL_CASES[i] for i in (3, 5, 7, 9, 13)] + [ALL_CASES[1]]


@pytest.mark.parametrize("kind,kwargs", STATEFUL_CASES)
def test_state_dict_round_trip_continues_bit_identically(kind, kwargs):
    batches = make_batches(7, seed=7)
    model_a = make_model(seed=3)
    opt_a, _ = engine_and_oracle(kind, kwargs)
    for x, y in batches[:3]:
        compute_grads(model_a, x, y)
        opt_a.step(model_a)

    # An identical copy of the model, and a new optimizer restored from the first one's state.
    model_b = make_model(seed=99)
    copy_weights(model_a, model_b)
    opt_b, _ = engine_and_oracle(kind, kwargs)
    state = opt_a.state_dict()
    opt_b.load_state_dict(state)
    assert opt_b.step_count == opt_a.step_count == 3
    # A third model continued by a fresh optimizer: must diverge when the state matters.
    model_c = make_model(seed=99)
    copy_weights(model_a, model_c)
    opt_c, _ = engine_and_oracle(kind, kwargs)

    for x, y in batches[3:]:
        for model, opt in ((model_a, opt_a), (model_b, opt_b), (model_c, opt_c)):
            compute_grads(model, x, y)
            opt.step(model)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert np.array_equal(a, b)
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if isinstance(sa[key], np.ndarray):
            assert np.array_equal(sa[key], sb[key]), key
        else:
            assert sa[key] == sb[key], key
    if any(isinstance(v, np.ndarray) for v in state.values()) or kind != "sgd":
        assert any(not np.array_equal(a, c) for a, c in zip(model_a.parameters(), model_c.parameters()))


def test_load_state_dict_restores_lr_and_step_for_adam_bias_correction():
    # Only the step count differs between the two runs: the bias correction must use the restored step.
    batches = make_batches(2)
    model_a, model_b = make_model(), make_model()
    opt_a = cx.AdamOptimizer(lr=0.01)
    compute_grads(model_a, *batches[0])
    opt_a.step(model_a)
    state = opt_a.state_dict()
    state["step"] = 10.0
    state["lr"] = 0.02
    copy_weights(model_a, model_b)
    opt_b = cx.AdamOptimizer(lr=0.01)
    opt_b.load_state_dict(state)
    assert opt_b.step_count == 10
    assert opt_b.learning_rate == 0.02

    oracle = AdamOracle(lr=0.02)
    oracle.t = 10
    oracle.m = [state[f"exp_avg.{i}"].astype(np.float64) for i in range(5)]
    oracle.v = [state[f"exp_avg_sq.{i}"].astype(np.float64) for i in range(5)]
    compute_grads(model_b, *batches[1])
    params, grads = snapshot(model_b)
    expected = oracle.step(params, grads)
    opt_b.step(model_b)
    for a, e in zip(model_b.parameters(), expected):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)


def test_state_dict_returns_copies_and_load_state_dict_copies_its_input():
    model = make_model()
    opt = cx.SGDOptimizer(0.1, momentum=0.9)
    compute_grads(model, *make_batches(1)[0])
    opt.step(model)
    state = opt.state_dict()
    original = state["momentum_buffer.0"].copy()
    state["momentum_buffer.0"][...] = 1234.0
    assert np.array_equal(opt.state_dict()["momentum_buffer.0"], original)

    other = cx.SGDOptimizer(0.1, momentum=0.9)
    state = opt.state_dict()
    other.load_state_dict(state)
    state["momentum_buffer.0"][...] = -5.0
    assert np.array_equal(other.state_dict()["momentum_buffer.0"], original)


def test_load_state_dict_of_a_fresh_optimizer_is_a_fresh_start():
    model_a, model_b = make_model(), make_model()
    opt_a = cx.AdamOptimizer(lr=0.01)
    opt_b = cx.AdamOptimizer(lr=0.01)
    opt_b.load_state_dict(cx.AdamOptimizer(lr=0.01).state_dict())
    for x, y in make_batches(3):
        for model, opt in ((model_a, opt_a), (model_b, opt_b)):
            compute_grads(model, x, y)
            opt.step(model)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert np.array_equal(a, b)


def _stepped(opt):
    model = make_model()
    compute_grads(model, *make_batches(1)[0])
    opt.step(model)
    return opt.state_dict()


def test_load_state_dict_rejects_bad_states():
    sgd_state = _stepped(cx.SGDOptimizer(0.1, momentum=0.9))
    adam_state = _stepped(cx.AdamOptimizer())

    with pytest.raises(ValueError):  # momentum buffers into Adam
        cx.AdamOptimizer().load_state_dict(sgd_state)
    with pytest.raises(ValueError):  # Adam moments into SGD with momentum
        cx.SGDOptimizer(0.1, momentum=0.9).load_state_dict(adam_state)
    with pytest.raises(ValueError):  # buffers into a stateless SGD
        cx.SGDOptimizer(0.1).load_state_dict(sgd_state)

    no_step = {k: v for k, v in adam_state.items() if k != "step"}
    with pytest.raises(ValueError, match="step"):
        cx.AdamOptimizer().load_state_dict(no_step)
    no_lr = {k: v for k, v in adam_state.items() if k != "lr"}
    with pytest.raises(ValueError, match="lr"):
        cx.AdamOptimizer().load_state_dict(no_lr)
    negative_step = dict(adam_state, step=-1.0)
    with pytest.raises(ValueError):
        cx.AdamOptimizer().load_state_dict(negative_step)
    half = {k: v for k, v in adam_state.items() if k != "exp_avg_sq.2"}
    with pytest.raises(ValueError):
        cx.AdamOptimizer().load_state_dict(half)


def test_failed_load_state_dict_leaves_the_optimizer_unchanged():
    # A rejected state must not be half-applied (here the engine would set step, then reject lr).
    model = make_model()
    opt = cx.AdamOptimizer(lr=0.01)
    compute_grads(model, *make_batches(1)[0])
    opt.step(model)
    before = opt.state_dict()
    bad = dict(before, step=100.0, lr=-1.0)
    for key in [k for k in bad if k.startswith("exp_avg.")]:
        bad[key] = bad[key] + 1.0
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert opt.step_count == 1
    assert opt.learning_rate == 0.01
    assert after.keys() == before.keys()
    for key in before:
        if isinstance(before[key], np.ndarray):
            assert np.array_equal(after[key], before[key]), key
        else:
            assert after[key] == before[key], key


def test_state_with_wrongly_shaped_buffer_is_rejected_not_used_out_of_bounds():
    # exp_avg.0 has the right shape but exp_avg_sq.0 is a single float: loading or stepping must raise
    # ValueError. Run in a subprocess: a kernel that trusts the shape writes past the buffer.
    code = textwrap.dedent(
        """
        import numpy as np, pycyxwiz as cx
        cx.manual_seed(0)
        m = cx.SequentialModel(); m.add(cx.LinearModule(64, 64))
        x = np.ones((4, 64), np.float32)
        out = m.forward(x); m.backward(np.ones_like(out))
        opt = cx.AdamOptimizer(0.1); opt.step(m)
        state = opt.state_dict()
        state["exp_avg_sq.0"] = np.zeros(1, np.float32)
        fresh = cx.AdamOptimizer(0.1)
        try:
            fresh.load_state_dict(state)
            fresh.step(m)
        except ValueError as e:
            print("VALUEERROR", e)
        else:
            print("ACCEPTED")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "VALUEERROR" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------- one optimizer, one model


@pytest.mark.parametrize(
    "make",
    [
        lambda: cx.SGDOptimizer(0.1, momentum=0.9),
        lambda: cx.AdamOptimizer(0.01),
        lambda: cx.AdamWOptimizer(0.01),
    ],
    ids=["sgd-momentum", "adam", "adamw"],
)
def test_one_optimizer_on_two_models_raises(make):
    model_a = make_model()
    opt = make()
    compute_grads(model_a, *make_batches(1)[0])
    opt.step(model_a)

    for model_b in (make_other_model(), _bigger_model()):
        x = np.ones((2, 4), np.float32)
        out = model_b.forward(x)
        model_b.backward(np.ones_like(out))
        before = [p.copy() for p in model_b.parameters()]
        with pytest.raises(ValueError, match="different model"):
            opt.step(model_b)
        # Nothing was updated and the step was not counted.
        for a, b in zip(model_b.parameters(), before):
            assert np.array_equal(a, b)
        assert opt.step_count == 1
    # The original model still works with it.
    compute_grads(model_a, *make_batches(1)[0])
    opt.step(model_a)
    assert opt.step_count == 2


def _bigger_model():
    # Same first parameter shape family as make_other_model but a different parameter count.
    cx.manual_seed(5)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 2))
    model.add(cx.LinearModule(2, 2))
    return model


# ------------------------------------------------------------------------------------------- torch


def _torch_run(kind, kwargs, n_steps=6):
    torch = pytest.importorskip("torch")
    model = make_model()
    params_t = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in model.parameters()]
    if kind == "sgd":
        kw = dict(lr=kwargs["lr"], momentum=kwargs.get("momentum", 0.0),
                  weight_decay=kwargs.get("weight_decay", 0.0), nesterov=kwargs.get("nesterov", False), dampening=0.0)
        opt_t = torch.optim.SGD(params_t, **kw)
        opt = cx.SGDOptimizer(**kwargs)
    else:
        betas = (kwargs.get("beta1", 0.9), kwargs.get("beta2", 0.999))
        default_wd = 0.0 if kind == "adam" else 0.01
        kw = dict(lr=kwargs["lr"], betas=betas, eps=kwargs.get("eps", 1e-8),
                  weight_decay=kwargs.get("weight_decay", default_wd), foreach=False)
        opt_t = (torch.optim.Adam if kind == "adam" else torch.optim.AdamW)(params_t, **kw)
        opt = (cx.AdamOptimizer if kind == "adam" else cx.AdamWOptimizer)(**kwargs)
    for step, (x, y) in enumerate(make_batches(n_steps)):
        compute_grads(model, x, y)
        # Identical parameters and gradients going into each step; the state stays each optimizer's own.
        with torch.no_grad():
            for pt, p in zip(params_t, model.parameters()):
                pt.copy_(torch.from_numpy(p))
        for pt, g in zip(params_t, model.gradients()):
            pt.grad = torch.from_numpy(g.copy())
        opt.step(model)
        opt_t.step()
        for i, (a, pt) in enumerate(zip(model.parameters(), params_t)):
            np.testing.assert_allclose(a, pt.detach().numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"step {step + 1}, parameter {i}")
    state = opt.state_dict()
    names = {"momentum_buffer": "momentum_buffer", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
    for i, pt in enumerate(params_t):
        for slot, tname in names.items():
            key = f"{slot}.{i}"
            if key in state:
                np.testing.assert_allclose(state[key], opt_t.state[pt][tname].numpy(), rtol=RTOL, atol=ATOL,
                                           err_msg=key)
    assert state["step"] == n_steps


@pytest.mark.parametrize("kind,kwargs", ALL_CASES)
def test_matches_torch_optim(kind, kwargs):
    _torch_run(kind, kwargs)
