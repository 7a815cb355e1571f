"""Mixed precision in one process: cx.autocast and cx.GradScaler.

Oracles: under autocast a LinearModule computes with its input and weight rounded to the 16-bit type
and accumulates in float32, so numpy on the rounded operands in float64 must agree to float32
accumulation error (bounded by |x16| |w16|^T); backward rounds the incoming gradient the same way.
Outside autocast nothing changes: the same training run, before and after autocast was used and with
autocast(enabled=False), ends with the same bits. What forward keeps for backward is observable
(Module._saved_tensors): a 16-bit copy, half the bytes, one copy shared by a fused Linear+ReLU and the
next Linear. GradScaler follows torch.amp.GradScaler's rules (back off on inf/NaN, grow after
growth_interval good steps).
"""

from __future__ import annotations

import numpy as np
import pytest

import pycyxwiz as cx

DTYPES = ["bfloat16", "float16"]
# bfloat16 products go to oneMKL's cblas_gemm_bf16bf16f32 (the mkl wheel) or oneDNN's matmul (the
# onednn-cpu-gomp wheel), whichever the first product measures fastest, else to the widened sgemm path
# (CI installs both wheels); each must meet the same oracle.
ONEMKL = "cblas_gemm_bf16bf16f32, sequential" in cx.build_info()["blas16"]
ONEDNN = cx.build_info()["conv"].startswith("oneDNN")
PRODUCTS = [pytest.param(("bfloat16", "onemkl"), id="bfloat16-onemkl",
                         marks=pytest.mark.skipif(not ONEMKL, reason="oneMKL (pip install mkl) is not installed: "
                                                  "bfloat16 products take the widened sgemm path only")),
            pytest.param(("bfloat16", "onednn"), id="bfloat16-onednn",
                         marks=pytest.mark.skipif(not ONEDNN, reason="oneDNN (pip install onednn-cpu-gomp) is not "
                                                  "installed")),
            pytest.param(("bfloat16", "sgemm"), id="bfloat16-sgemm"),
            pytest.param(("float16", "sgemm"), id="float16-sgemm")]


def bf16(x):
    """float32 -> bfloat16 (nearest, ties to even) -> float32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def round16(x, dtype):
    x = np.asarray(x, dtype=np.float32)
    return bf16(x) if dtype == "bfloat16" else x.astype(np.float16).astype(np.float32)


@pytest.fixture
def products(request):
    """(dtype, path): the 16-bit type and where its products are computed, for the duration of a test."""
    dtype, path = request.param
    cx._core._set_blas16_provider(path)
    if path != "sgemm":
        assert {"onemkl": "oneMKL", "onednn": "oneDNN"}[path] + " (forced)" in cx.build_info()["blas16"]
    yield dtype
    cx._core._set_blas16_provider("auto")


def assert_float32_accumulation(got, a, b, name):
    """got ~ a @ b in float64, within float32 accumulation error of sum |a||b|."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    want = a64 @ b64
    bound = 2e-6 * a.shape[-1] ** 0.5 * (np.abs(a64) @ np.abs(b64)) + 1e-7
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.all(err <= bound), f"{name}: max error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"


def assert_not_float32(got, a32, b32, name):
    """The result differs from the product of the unrounded operands: the rounding really happened."""
    assert not np.allclose(got, np.asarray(a32, np.float64) @ np.asarray(b32, np.float64), rtol=1e-6, atol=1e-7), name


# --- the autocast state ---------------------------------------------------------------------------

def test_autocast_state_nests_and_restores():
    assert not cx.is_autocast_enabled()
    with cx.autocast("bfloat16") as ac:
        assert ac.dtype == "bfloat16" and ac.enabled
        assert cx.is_autocast_enabled() and cx.get_autocast_dtype() == "bfloat16"
        with cx.autocast("fp16"):
            assert cx.get_autocast_dtype() == "float16"
            with cx.autocast("bfloat16", enabled=False):
                assert not cx.is_autocast_enabled()
            assert cx.get_autocast_dtype() == "float16"
        assert cx.get_autocast_dtype() == "bfloat16"
    assert not cx.is_autocast_enabled()
    with pytest.raises(ValueError, match=r"'float64'.*'bfloat16'.*'float16'"):
        cx.autocast("float64")
    assert repr(cx.autocast("bf16")) == "autocast(dtype='bfloat16', enabled=True)"


def test_autocast_is_per_thread():
    import threading

    seen = []
    with cx.autocast("bfloat16"):
        t = threading.Thread(target=lambda: seen.append(cx.is_autocast_enabled()))
        t.start()
        t.join()
    assert seen == [False]


# --- LinearModule against numpy on the rounded operands -------------------------------------------

@pytest.mark.parametrize("products", PRODUCTS, indirect=True)
@pytest.mark.parametrize("shape", [(7, 37, 23, True), (5, 1024, 1500, False), (1100, 1024, 40, True)],
                         ids=["small", "weight-blocks", "input-blocks"])
def test_linear_forward_backward_match_numpy_on_rounded_operands(products, shape):
    dtype = products
    rows, n_in, n_out, bias = shape  # blocks of about 4 MiB: 1024 rows of 1024 floats
    cx.manual_seed(1)
    lin = cx.LinearModule(n_in, n_out, bias=bias)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    g = rng.standard_normal((rows, n_out)).astype(np.float32) * 1e-2
    params = [np.array(p, copy=True) for p in lin.parameters()]
    w = params[0]
    with cx.autocast(dtype):
        y = lin.forward(x)
    dx = lin.backward(g)  # outside autocast, as torch scripts call backward: follows what forward did
    x16, w16, g16 = round16(x, dtype), round16(w, dtype), round16(g, dtype)
    want_y = x16.astype(np.float64) @ w16.T.astype(np.float64)
    if bias:
        want_y += params[1]
    assert_float32_accumulation(y - (params[1] if bias else 0), x16, w16.T, "forward")
    assert np.abs(y - want_y).max() < 1e-3
    assert_not_float32(y - (params[1] if bias else 0), x, w.T, "forward used the float32 operands")
    grads = lin.gradients()
    assert_float32_accumulation(grads[0], g16.T, x16, "weight gradient")
    if bias:
        np.testing.assert_allclose(grads[1], g16.astype(np.float64).sum(0), rtol=1e-5, atol=1e-6)
    assert_float32_accumulation(dx, g16, w16, "input gradient")
    assert_not_float32(dx, g, w, "input gradient used the float32 operands")
    # Master weights untouched and float32.
    for p, q in zip(lin.parameters(), params):
        assert p.dtype == np.float32 and np.array_equal(p, q)
    assert y.dtype == np.float32 and dx.dtype == np.float32


def numpy_mlp_step(x, target_grad, params, dtype):
    """Linear -> ReLU -> Linear under autocast, in numpy: the same roundings as the engine's."""
    w1, b1, w2, b2 = [np.asarray(p, np.float64) for p in params]
    x16 = round16(x, dtype).astype(np.float64)
    h = np.maximum(x16 @ round16(w1, dtype).T.astype(np.float64) + b1, 0)
    h16 = round16(h.astype(np.float32), dtype).astype(np.float64)
    out = h16 @ round16(w2, dtype).T.astype(np.float64) + b2
    g = round16(target_grad, dtype).astype(np.float64)
    dw2, db2 = g.T @ h16, g.sum(0)
    dh = (g @ round16(w2, dtype).astype(np.float64)) * (h16 > 0)
    g1 = round16(dh.astype(np.float32), dtype).astype(np.float64)
    dw1, db1 = g1.T @ x16, g1.sum(0)
    return out, [dw1, db1, dw2, db2]


@pytest.mark.parametrize("products", PRODUCTS, indirect=True)
def test_mlp_with_fused_relu_matches_numpy(products):
    dtype = products
    cx.manual_seed(3)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(30, 40), cx.ReLUModule(), cx.LinearModule(40, 6)):
        m.add(layer)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 30)).astype(np.float32)
    y = rng.integers(0, 6, 9)
    loss = cx.CrossEntropyLoss()
    with cx.autocast(dtype):
        out = m.forward(x)
    g = loss.backward(out, y)
    m.zero_grad()
    m.backward(g)
    want_out, want_grads = numpy_mlp_step(x, g, m.parameters(), dtype)
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
    for i, (got, want) in enumerate(zip(m.gradients(), want_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=f"gradient {i}")


# --- float32 outside autocast: unchanged ----------------------------------------------------------

def train_digest(steps=4, inside=None):
    cx.manual_seed(11)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(20, 32), cx.ReLUModule(), cx.LinearModule(32, 32), cx.ReLUModule(),
                  cx.DropoutModule(0.2), cx.LinearModule(32, 4), cx.ReLUModule()):
        m.add(layer)
    opt = cx.AdamOptimizer(0.01)
    loss = cx.CrossEntropyLoss()
    rng = np.random.default_rng(5)
    for _ in range(steps):
        x = rng.standard_normal((16, 20)).astype(np.float32)
        y = rng.integers(0, 4, 16)
        if inside is None:
            out = m.forward(x)
        else:
            with inside:
                out = m.forward(x)
        m.zero_grad()
        m.backward(loss.backward(out, y))
        opt.step(m)
    return np.concatenate([p.ravel() for p in m.parameters()]).tobytes(), m


def test_float32_outside_autocast_is_bit_identical():
    before, m = train_digest()
    assert all(t["dtype"] == "float32" for i in range(len(m)) for t in m[i]._saved_tensors())
    bf, _ = train_digest(inside=cx.autocast("bfloat16"))  # autocast used in between
    assert bf != before
    assert train_digest()[0] == before
    assert train_digest(inside=cx.autocast("bfloat16", enabled=False))[0] == before


# --- what forward keeps: 16 bits, half the bytes, one copy per fused pair -------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_saved_activations_are_16_bit_and_shared_by_the_fused_pair(dtype):
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(64, 128), cx.ReLUModule(), cx.LinearModule(128, 128), cx.ReLUModule(),
                  cx.LinearModule(128, 10)):
        m.add(layer)
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)

    def saved():
        return [m[i]._saved_tensors() for i in range(len(m))]

    m.forward(x)
    plain = saved()
    with cx.autocast(dtype):
        m.forward(x)
    mixed = saved()
    bytes32 = sum(t["nbytes"] for s in plain for t in s)
    kept16 = {t["data_ptr"]: t["nbytes"] for s in mixed for t in s}  # distinct buffers
    kept32 = {t["data_ptr"]: t["nbytes"] for s in plain for t in s}
    assert all(t["dtype"] == dtype for s in mixed for t in s)
    for s32, s16 in zip(plain, mixed):
        for a, b in zip(s32, s16):
            assert a["shape"] == b["shape"] and b["nbytes"] * 2 == a["nbytes"]
    # The fused ReLU and the next Linear keep one buffer (as in float32, where they share the output).
    assert mixed[1][0]["data_ptr"] == mixed[2][0]["data_ptr"]
    assert mixed[3][0]["data_ptr"] == mixed[4][0]["data_ptr"]
    assert plain[1][0]["data_ptr"] == plain[2][0]["data_ptr"]
    assert sum(kept16.values()) * 2 == sum(kept32.values())
    assert bytes32 == 2 * sum(t["nbytes"] for s in mixed for t in s)


def test_unfused_relu_keeps_a_16_bit_copy_and_masks_by_its_sign():
    relu = cx.ReLUModule()
    x = np.array([[-1.0, 0.0, 2.0, 1e-30, -1e-30, 3.0]], dtype=np.float32)
    with cx.autocast("float16"):
        y = relu.forward(x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))   # the output is float32, unrounded
    (saved,) = relu._saved_tensors()
    assert saved["dtype"] == "float16" and saved["nbytes"] == 12
    g = np.arange(1, 7, dtype=np.float32)[None]
    # 1e-30 is 0 in float16: a ReLU on the 16-bit tensor passes no gradient there (as torch's would).
    np.testing.assert_array_equal(relu.backward(g), [[0, 0, 3, 0, 0, 6]])


def test_kept_activation_memory_halves_in_a_fresh_process(tmp_path):
    """Resident memory held between forward and backward, 784-2048-2048-10 at batch 512. A fixed mmap
    threshold gives every tensor its own mapping, unmapped when freed: the RSS is the live tensors."""
    import subprocess
    import sys

    script = r'''
import sys, numpy as np, pycyxwiz as cx
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
m = cx.SequentialModel()
for l in (cx.LinearModule(784, 2048), cx.ReLUModule(), cx.LinearModule(2048, 2048), cx.ReLUModule(),
          cx.LinearModule(2048, 10)):
    m.add(l)
x = np.random.default_rng(0).standard_normal((512, 784)).astype(np.float32)
mode = sys.argv[1]
# The warm-up in the measured mode: a 16-bit GEMM library loaded at first use is code, not activations.
with cx.autocast("bfloat16" if mode == "fp32" else mode, enabled=mode != "fp32"):
    m.forward(x[:8])
base = rss()
with cx.autocast("bfloat16" if mode == "fp32" else mode, enabled=mode != "fp32"):
    out = m.forward(x)
print(rss() - base)
'''
    path = tmp_path / "kept.py"
    path.write_text(script)
    kept = {}
    for mode in ("fp32", "bfloat16"):
        r = subprocess.run([sys.executable, str(path), mode], capture_output=True, text=True, timeout=60,
                           env={"CYXWIZ_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                # freed tensors leave the RSS: no host block cache, glibc unmaps them
                                "MALLOC_MMAP_THRESHOLD_": "65536", "CYXWIZ_HOST_CACHE": "0"})
        assert r.returncode == 0, r.stderr
        kept[mode] = int(r.stdout.split()[-1])
    # float32 keeps 512 x (784 copied + 2048 + 2048) floats = 10 MB (plus the output); bf16 half of it.
    acts32 = 512 * (784 + 2048 + 2048) * 4
    assert kept["fp32"] > 0.8 * acts32, kept
    assert kept["bfloat16"] < 0.65 * kept["fp32"], kept


# --- GradScaler -----------------------------------------------------------------------------------

def small_model(seed=0):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(8, 16), cx.ReLUModule(), cx.LinearModule(16, 3)):
        m.add(layer)
    return m


def scaled_step(m, scaler, opt, x, y, boost=1.0):
    loss = cx.CrossEntropyLoss()
    with cx.autocast("float16"):
        out = m.forward(x)
    m.zero_grad()
    m.backward(scaler.scale(loss.backward(out, y)) * np.float32(boost))
    stepped = scaler.step(opt, m)
    scaler.update()
    return stepped


def test_grad_scaler_scales_and_unscales_exactly():
    s = cx.GradScaler(init_scale=1024.0)
    g = np.array([[0.5, -0.25]], np.float32)
    np.testing.assert_array_equal(s.scale(g), g * 1024)
    assert s.scale(2.0) == 2048.0 and s.get_scale() == 1024.0
    one = s.scale(np.array([[0.5]], np.float32))   # a one-element gradient stays an array
    assert isinstance(one, np.ndarray) and one.shape == (1, 1) and one[0, 0] == 512.0
    m = small_model()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)
    loss = cx.CrossEntropyLoss()
    with cx.autocast("float16"):
        out = m.forward(x)
    m.backward(s.scale(loss.backward(out, y)))
    scaled = [np.array(g, copy=True) for g in m.gradients()]
    assert s.unscale_(m) is True
    for got, big in zip(m.gradients(), scaled):
        np.testing.assert_array_equal(got, big / np.float32(1024))
    with pytest.raises(ValueError, match="unscale_\\(\\) has already been called"):
        s.unscale_(m)
    assert s.step(cx.SGDOptimizer(0.1), m) is True   # no second unscale
    with pytest.raises(ValueError, match="step\\(\\) has already been called"):
        s.step(cx.SGDOptimizer(0.1), m)
    s.update()
    with pytest.raises(ValueError, match="no step\\(\\)"):
        s.update()


def test_grad_scaler_skips_an_overflowing_step_and_backs_off():
    m = small_model()
    scaler = cx.GradScaler(init_scale=2.0 ** 10, growth_interval=1000)
    opt = cx.SGDOptimizer(0.1)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)
    assert scaled_step(m, scaler, opt, x, y)
    before = [np.array(p, copy=True) for p in m.parameters()]
    # 1e30: the gradient rounded to float16 in backward is inf (float16 ends at 65504).
    assert scaled_step(m, scaler, opt, x, y, boost=1e30) is False
    assert scaler.last_step_skipped
    for p, q in zip(m.parameters(), before):
        assert np.array_equal(p, q), "a skipped step changed the parameters"
    assert scaler.get_scale() == 2.0 ** 9 and scaler.state_dict()["_growth_tracker"] == 0
    assert opt.step_count == 1
    assert scaled_step(m, scaler, opt, x, y)      # training goes on
    assert not scaler.last_step_skipped and opt.step_count == 2
    assert all(np.isfinite(p).all() for p in m.parameters())


def test_grad_scaler_grows_after_growth_interval_good_steps():
    m = small_model()
    scaler = cx.GradScaler(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=3)
    opt = cx.SGDOptimizer(0.01)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)
    scales = []
    for step in range(8):
        scaled_step(m, scaler, opt, x, y, boost=1e30 if step == 4 else 1.0)
        scales.append(scaler.get_scale())
    # torch's rule: grow on the 3rd good step in a row, back off (and restart the count) on an inf.
    assert scales == [8, 8, 32, 32, 8, 8, 8, 32]


def test_grad_scaler_matches_an_unscaled_float16_run():
    """A power-of-two scale changes no bits but those float16 would flush: the training ends alike."""
    x = np.random.default_rng(3).standard_normal((32, 8)).astype(np.float32)
    y = np.random.default_rng(4).integers(0, 3, 32)
    runs = []
    for init in (1.0, 2.0 ** 12):
        m = small_model(5)
        scaler = cx.GradScaler(init_scale=init)
        opt = cx.SGDOptimizer(0.1)
        for _ in range(5):
            assert scaled_step(m, scaler, opt, x, y)
        runs.append(np.concatenate([p.ravel() for p in m.parameters()]))
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-3, atol=1e-4)


def test_grad_scaler_state_dict_round_trip_and_disabled():
    s = cx.GradScaler(init_scale=256.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    m, opt = small_model(), cx.SGDOptimizer(0.1)
    x, y = np.ones((2, 8), np.float32), np.array([0, 1])
    for _ in range(2):
        scaled_step(m, s, opt, x, y)
    state = s.state_dict()
    assert state == {"scale": 256.0, "growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 7,
                     "_growth_tracker": 2}
    t = cx.GradScaler()
    t.load_state_dict(state)
    assert t.state_dict() == state and t.get_scale() == 256.0 and t.get_growth_interval() == 7
    with pytest.raises(ValueError, match="backoff_factor"):
        t.load_state_dict({**state, "backoff_factor": 2.0})
    off = cx.GradScaler(enabled=False)
    g = np.ones((1, 3), np.float32)
    assert off.scale(g) is not None and np.array_equal(off.scale(g), g) and off.get_scale() == 1.0
    assert off.state_dict() == {}
    assert scaled_step(m, off, opt, x, y) is True
    with pytest.raises(ValueError, match="empty"):
        t.load_state_dict({})


def test_trainer_config_mixed_precision():
    c = cx.distributed.DistributedTrainingConfig()
    assert c.mixed_precision is None
    for v in ("bf16", "fp16", None):
        c.mixed_precision = v
        assert c.mixed_precision == v
    c.mixed_precision = "bf16"
    assert "mixed_precision='bf16'" in repr(c)
    with pytest.raises(ValueError, match="'bf16' or 'fp16'"):
        c.mixed_precision = "fp8"


# --- with gradient checkpointing ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpointed_segments_recompute_under_the_forwards_autocast(dtype):
    """backward (outside autocast) recomputes a segment as its forward ran: in 16 bits, the same bits."""
    def run(segments):
        cx.manual_seed(2)
        m = cx.SequentialModel()
        for layer in (cx.LinearModule(24, 48), cx.ReLUModule(), cx.LinearModule(48, 48), cx.ReLUModule(),
                      cx.DropoutModule(0.1), cx.LinearModule(48, 48), cx.ReLUModule(), cx.LinearModule(48, 5)):
            m.add(layer)
        m.set_gradient_checkpointing(segments)
        opt, loss = cx.AdamOptimizer(0.01), cx.CrossEntropyLoss()
        rng = np.random.default_rng(0)
        for _ in range(3):
            x, y = rng.standard_normal((16, 24)).astype(np.float32), rng.integers(0, 5, 16)
            with cx.autocast(dtype):
                out = m.forward(x)
            m.zero_grad()
            m.backward(loss.backward(out, y))
            grads = np.concatenate([g.ravel() for g in m.gradients()])
            opt.step(m)
        return grads, np.concatenate([p.ravel() for p in m.parameters()])

    g1, p1 = run(0)
    g3, p3 = run(3)
    # A replay in float32 (backward outside autocast) gives other gradients: this fails without the
    # autocast state kept per segment.
    assert np.array_equal(g1, g3) and np.array_equal(p1, p3)


# ---- the bfloat16 GEMM provider: measured at the first product, or forced by CYXWIZ_BF16_GEMM ----------

def _blas16_info(env_value):
    import os
    import subprocess
    import sys
    code = "import pycyxwiz as cx; print(cx.build_info()['blas16'])"
    env = {**os.environ, "CYXWIZ_BF16_GEMM": env_value}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_bf16_provider_is_measured_or_forced():
    auto = _blas16_info("auto")
    assert auto.returncode == 0, auto.stderr
    if ONEMKL or ONEDNN:
        # The choice names every candidate's measured speed, the widened sgemm among them.
        assert "measured at" in auto.stdout and "widened sgemm" in auto.stdout and "GFLOP/s" in auto.stdout, auto.stdout
    forced = _blas16_info("sgemm")
    assert forced.returncode == 0 and "bfloat16 products: widened sgemm (forced)" in forced.stdout, forced.stdout


def test_bf16_provider_variable_with_a_bad_value_says_what_it_takes():
    bad = _blas16_info("fastest")
    assert bad.returncode != 0
    assert "CYXWIZ_BF16_GEMM='fastest'" in bad.stderr and "'onednn'" in bad.stderr, bad.stderr


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_mask_from_the_16_bit_copy_handles_special_values(dtype):
    """Under autocast a ReLUModule keeps a 16-bit copy of its input and backward masks by its bits:
    g where the copy is > 0 (not at 0 or -0, not NaN, yes at +inf and the smallest positive values)."""
    x = np.array([0.0, -0.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan, 1.0, -1.0, 3e38, 6e-8, -6e-8] * 7000,
                 np.float32).reshape(84, 1000)
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    relu = cx.ReLUModule()
    with cx.autocast(dtype):
        relu.forward(x)
    with np.errstate(over="ignore", invalid="ignore"):  # 3e38 is +inf in float16
        kept = bf16(x) if dtype == "bfloat16" else x.astype(np.float16).astype(np.float32)
        want = np.where(kept > 0, g, np.float32(0))
    np.testing.assert_array_equal(relu.backward(g), want)
