"""The numpy boundary (zero-copy views, conversions, argument errors), seeding, build_info and the BLAS
thread policy (checked in fresh interpreters, since it is decided once at import)."""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from harness import clean_env

import pycyxwiz as cx


def linear_model(in_features=4, out_features=3, bias=True, seed=0):
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(in_features, out_features, bias=bias))
    return model


def mlp(seed=0):
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(6, 8))
    model.add(cx.TanhModule())
    model.add(cx.LinearModule(8, 3))
    return model


def mlp_oracle(model, x):
    w1, b1, w2, b2 = [p.astype(np.float64) for p in model.parameters()]
    return np.tanh(x.astype(np.float64) @ w1.T + b1) @ w2.T + b2


def batch(rows=5, features=6, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, features)).astype(np.float32)


# ------------------------------------------------------------------------------------ parameter views


def test_forward_matches_numpy_oracle():
    model = mlp()
    x = batch()
    out = model.forward(x)
    assert out.dtype == np.float32 and out.shape == (5, 3)
    np.testing.assert_allclose(out, mlp_oracle(model, x), rtol=1e-5, atol=1e-6)


def test_parameters_are_writable_views_of_the_live_weights():
    model = linear_model()
    weight, bias = model.parameters()
    assert weight.shape == (3, 4) and bias.shape == (3,)
    assert weight.dtype == bias.dtype == np.float32
    assert weight.flags.writeable and weight.flags.c_contiguous
    x = batch(2, 4)

    weight[...] = 0.0
    bias[...] = np.array([1.0, -2.0, 3.0], np.float32)
    assert np.array_equal(model.forward(x), np.tile(bias, (2, 1)))

    # A second call returns views of the same memory, and named_parameters too.
    again = model.parameters()
    assert np.shares_memory(again[0], weight) and np.shares_memory(again[1], bias)
    named = dict(model.named_parameters())
    assert list(named) == ["0.weight", "0.bias"]
    assert np.shares_memory(named["0.weight"], weight)
    named["0.weight"][...] = np.eye(3, 4, dtype=np.float32)
    expected = x[:, :3] + bias
    np.testing.assert_allclose(model.forward(x), expected, rtol=1e-6)


def test_parameter_views_outlive_the_model():
    model = linear_model()
    weight = model.parameters()[0]
    expected = weight.copy()
    del model
    import gc

    gc.collect()
    assert np.array_equal(weight, expected)  # the view keeps the storage alive


def test_gradients_are_writable_views_used_by_the_optimizer():
    model = linear_model()
    x = batch(3, 4)
    out = model.forward(x)
    model.backward(np.ones_like(out))
    grad_w, grad_b = model.gradients()
    np.testing.assert_allclose(grad_w, np.ones((3, 3), np.float32).T @ x, rtol=1e-5)
    np.testing.assert_allclose(grad_b, np.full(3, 3.0, np.float32))
    assert np.shares_memory(model.gradients()[0], grad_w)

    # Overwrite the gradient through the view: the optimizer must use exactly that.
    grad_w[...] = 1.0
    grad_b[...] = -2.0
    before = [p.copy() for p in model.parameters()]
    cx.SGDOptimizer(0.5).step(model)
    np.testing.assert_allclose(model.parameters()[0], before[0] - 0.5, rtol=1e-6)
    np.testing.assert_allclose(model.parameters()[1], before[1] + 1.0, rtol=1e-6)
    model.zero_grad()
    assert not grad_w.any() and not grad_b.any()


def test_forward_does_not_modify_its_input():
    model = mlp()
    x = batch()
    keep = x.copy()
    out = model.forward(x)
    model.backward(np.ones_like(out))
    assert np.array_equal(x, keep)


# -------------------------------------------------------------------------------------------- cx.Tensor


def test_tensor_wraps_float32_array_without_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = cx.Tensor(a)
    assert t.shape == (3, 4)
    assert t.dtype == "float32"
    assert t.device == "cpu"
    assert t.ndim == 2 and t.numel() == 12 and len(t) == 3
    assert np.shares_memory(np.asarray(t), a)
    assert np.shares_memory(t.numpy(), a)
    a[1, 2] = 99.0
    assert t.numpy()[1, 2] == 99.0
    t.numpy()[0, 0] = -5.0
    assert a[0, 0] == -5.0
    assert "shape=(3, 4)" in repr(t) and "float32" in repr(t)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_tensor_wraps_other_native_dtypes_without_copy(dtype):
    a = np.arange(6, dtype=dtype).reshape(2, 3)
    t = cx.Tensor(a)
    assert t.dtype == np.dtype(dtype).name
    assert np.shares_memory(np.asarray(t), a)
    assert np.asarray(t).dtype == dtype
    assert np.array_equal(np.asarray(t), a)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.float16])
def test_tensor_converts_other_numeric_dtypes_to_float32(dtype):
    a = np.arange(6, dtype=dtype).reshape(3, 2)
    t = cx.Tensor(a)
    assert t.dtype == "float32"
    assert np.array_equal(np.asarray(t), a.astype(np.float32))


def test_tensor_from_non_contiguous_array_is_a_converted_copy():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (base[:, ::2], base.T, np.asfortranarray(base)):
        t = cx.Tensor(view)
        assert t.shape == view.shape
        assert np.array_equal(np.asarray(t), view)
        assert np.asarray(t).flags.c_contiguous


def test_tensor_keeps_its_memory_alive():
    a = np.arange(5, dtype=np.float32)
    t = cx.Tensor(a)
    del a
    import gc

    gc.collect()
    assert np.array_equal(t.numpy(), np.arange(5, dtype=np.float32))


def test_tensor_over_read_only_memory_does_not_hand_out_writable_views():
    # A read-only array (or a buffer over immutable bytes) must not become writable through cx.Tensor.
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    view = np.asarray(cx.Tensor(a))
    assert not (view.flags.writeable and np.shares_memory(view, a))

    immutable = bytes(16)
    b = np.frombuffer(immutable, dtype=np.float32)
    view = cx.Tensor(b).numpy()
    assert not (view.flags.writeable and np.shares_memory(view, b))


def test_tensor_rejects_non_numeric():
    for bad in (np.array(["a", "b"]), np.array([object(), object()]), np.array([b"x"]), np.array([1 + 2j])):
        with pytest.raises(TypeError):
            cx.Tensor(bad)


def test_forward_accepts_a_float32_tensor():
    model = mlp()
    x = batch()
    assert np.array_equal(model.forward(cx.Tensor(x)), model.forward(x))


def _run_isolated(code):
    """Runs `code` in a fresh interpreter (a memory error there cannot take the test session down)."""
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=clean_env())
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith("OK"), proc.stdout


def test_forward_accepts_tensors_of_other_dtypes():
    # A float64/int cx.Tensor is converted to float32 like the numpy array it wraps.
    _run_isolated(
        """
        import gc
        import numpy as np, pycyxwiz as cx
        cx.manual_seed(0)
        m = cx.SequentialModel(); m.add(cx.LinearModule(6, 8)); m.add(cx.TanhModule()); m.add(cx.LinearModule(8, 3))
        x = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
        ref = m.forward(x)
        for dtype in (np.float64, np.int32, np.int64):
            xi = x.astype(dtype)
            for _ in range(20):
                out = m.forward(cx.Tensor(xi))
                junk = [np.full((5, 6), 7.0) for _ in range(20)]
                gc.collect()
                assert np.array_equal(out, m.forward(xi.astype(np.float32))), dtype
        print("OK")
        """
    )


def test_losses_accept_tensor_targets():
    _run_isolated(
        """
        import gc
        import numpy as np, pycyxwiz as cx
        logits = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
        labels = np.array([0, 3, 1, 2, 3, 0])
        ce = cx.CrossEntropyLoss()
        ref, ref_grad = ce.forward(logits, labels), ce.backward(logits, labels)
        for dtype in (np.int64, np.int32):
            for _ in range(20):
                loss = ce.forward(logits, cx.Tensor(labels.astype(dtype)))
                grad = ce.backward(logits, cx.Tensor(labels.astype(dtype)))
                junk = [np.full(6, 7, np.int64) for _ in range(20)]
                gc.collect()
                assert loss == ref and np.array_equal(grad, ref_grad), dtype
        target = np.random.default_rng(2).normal(size=(6, 4))
        mse = cx.MSELoss()
        ref = mse.forward(logits, target.astype(np.float32))
        for _ in range(20):
            loss = mse.forward(logits, cx.Tensor(target))
            junk = [np.full((6, 4), 7.0) for _ in range(20)]
            gc.collect()
            assert loss == ref
        print("OK")
        """
    )


# ----------------------------------------------------------------------------------------- conversions


def test_float64_input_gives_the_float32_result():
    model = mlp()
    x64 = np.random.default_rng(3).normal(size=(5, 6))
    out64 = model.forward(x64)
    out32 = model.forward(x64.astype(np.float32))
    assert out64.dtype == np.float32
    assert np.array_equal(out64, out32)
    np.testing.assert_allclose(out64, mlp_oracle(model, x64.astype(np.float32)), rtol=1e-5, atol=1e-6)
    # Gradients from a float64 grad_output equal those from its float32 rounding.
    model.zero_grad()
    g = np.random.default_rng(4).normal(size=out64.shape)
    model.forward(x64)
    model.backward(g)
    grads64 = [gr.copy() for gr in model.gradients()]
    model.zero_grad()
    model.forward(x64.astype(np.float32))
    model.backward(g.astype(np.float32))
    for a, b in zip(grads64, model.gradients()):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float16])
def test_other_numeric_inputs_are_converted(dtype):
    model = mlp()
    x = (np.arange(30).reshape(5, 6) % 7).astype(dtype)
    assert np.array_equal(model.forward(x), model.forward(x.astype(np.float32)))


def test_non_contiguous_inputs_work():
    model = mlp()
    big = batch(10, 12, seed=5)
    for x in (big[::2, ::2], big[:5, 3:9], np.asfortranarray(big[:5, :6]), big[:6, :5].T):
        assert not x.flags.c_contiguous
        expected = model.forward(np.ascontiguousarray(x))
        assert np.array_equal(model.forward(x), expected)
        np.testing.assert_allclose(expected, mlp_oracle(model, x), rtol=1e-5, atol=1e-6)


def test_python_lists_are_accepted():
    model = mlp()
    x = batch(2)
    assert np.array_equal(model.forward(x.tolist()), model.forward(x))


def _ce_oracle(logits, labels):
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.intc, np.uintc, np.longlong, np.ulonglong]


def test_integer_labels_of_every_int_dtype_give_the_same_loss():
    logits = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    labels = np.array([0, 3, 1, 2, 3, 0])
    loss_fn = cx.CrossEntropyLoss()
    reference = loss_fn.forward(logits, labels)
    assert reference == pytest.approx(_ce_oracle(logits, labels), rel=1e-6)
    ref_grad = loss_fn.backward(logits, labels)
    for dtype in INT_DTYPES + [np.float32, np.float64]:  # whole-number floats are accepted as labels too
        y = labels.astype(dtype)
        assert loss_fn.forward(logits, y) == reference, dtype
        assert np.array_equal(loss_fn.backward(logits, y), ref_grad), dtype
        assert cx.accuracy(logits, y) == cx.accuracy(logits, labels)
    # Non-contiguous labels too.
    doubled = np.repeat(labels, 2)[::2]
    assert loss_fn.forward(logits, doubled) == reference


def test_non_integer_or_out_of_range_labels_are_rejected():
    logits = np.zeros((2, 3), np.float32)
    loss_fn = cx.CrossEntropyLoss()
    with pytest.raises(ValueError, match="whole numbers"):
        loss_fn.forward(logits, np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="out of range"):
        loss_fn.forward(logits, np.array([0, 3]))
    with pytest.raises(ValueError, match="out of range"):
        loss_fn.forward(logits, np.array([0, -1]))
    with pytest.raises(ValueError, match="out of range"):
        loss_fn.forward(logits, np.array([0, 2**63], dtype=np.uint64))


# ------------------------------------------------------------------------------------ argument errors


def test_wrong_feature_count_names_expected_and_actual_shape():
    model = linear_model(4, 3)
    with pytest.raises(ValueError) as info:
        model.forward(np.ones((2, 5), np.float32))
    message = str(info.value)
    assert "(batch, 4)" in message
    assert "(2, 5)" in message


@pytest.mark.parametrize("shape", [(2, 4, 3), (4,), (1, 1, 4, 1)])
def test_input_without_linears_last_dimension_raises_value_error(shape):
    """A linear layer takes (batch, 4) or (..., 4): a 1-D input, or one whose last dimension is not 4,
    is refused naming both. (2, 3, 4) and (1, 1, 1, 4) are rows of the last dimension, as in torch."""
    model = linear_model(4, 3)
    with pytest.raises(ValueError) as info:
        model.forward(np.ones(shape, np.float32))
    assert "(batch, 4)" in str(info.value) and "(..., 4)" in str(info.value)
    assert str(shape) in str(info.value)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([["a", "b", "c", "d"]]),
        np.array([[object(), 1, 2, 3]], dtype=object),
        np.array([[b"a", b"b", b"c", b"d"]]),
        "abcd",
        np.ones((1, 4), np.complex64),
    ],
    ids=["str", "object", "bytes", "python-str", "complex"],
)
def test_non_numeric_input_raises_type_error(bad):
    model = linear_model(4, 3)
    with pytest.raises(TypeError):
        model.forward(bad)


def test_non_numeric_labels_raise_type_error():
    logits = np.zeros((2, 3), np.float32)
    for bad in (np.array(["a", "b"]), np.array([object(), object()])):
        with pytest.raises(TypeError):
            cx.CrossEntropyLoss().forward(logits, bad)


def test_backward_with_wrong_gradient_shape_raises_value_error():
    model = linear_model(4, 3)
    model.forward(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        model.backward(np.ones((2, 4), np.float32))


# --------------------------------------------------------------------------------------------- seeding


def _dropout_model():
    model = cx.SequentialModel()
    model.add(cx.DropoutModule(0.5))
    return model


def test_manual_seed_reproduces_weights_and_dropout_masks():
    x = np.ones((8, 16), np.float32)

    def run(seed):
        cx.manual_seed(seed)
        model = cx.SequentialModel()
        model.add(cx.LinearModule(16, 16))
        weights = [p.copy() for p in model.parameters()]
        masks = [_dropout_model().forward(x) for _ in range(2)]
        return weights, masks

    w1, m1 = run(42)
    w2, m2 = run(42)
    w3, m3 = run(43)
    for a, b in zip(w1, w2):
        assert np.array_equal(a, b)
    for a, b in zip(m1, m2):
        assert np.array_equal(a, b)
    assert not np.array_equal(m1[0], m1[1])  # the stream advances between calls
    assert any(not np.array_equal(a, b) for a, b in zip(w1, w3))
    assert not np.array_equal(m1[0], m3[0])
    # Inverted dropout: kept values scaled by 1/(1-p), roughly half kept.
    assert set(np.unique(m1[0])) <= {0.0, 2.0}
    assert 0.3 < (m1[0] != 0).mean() < 0.7


def test_weight_init_bound_matches_kaiming_uniform():
    cx.manual_seed(0)
    layer = cx.LinearModule(400, 50)
    weight, bias = layer.parameters()
    bound = 1 / np.sqrt(400)
    assert np.abs(weight).max() <= bound and np.abs(bias).max() <= bound
    assert np.abs(weight).max() > 0.9 * bound
    assert abs(weight.mean()) < 0.05 * bound


def test_dropout_eval_mode_is_identity():
    model = _dropout_model()
    model.eval()
    x = batch(4, 10)
    assert np.array_equal(model.forward(x), x)


def test_default_seed_is_the_same_in_every_process():
    code = "import pycyxwiz as cx; m = cx.LinearModule(3, 2); print(m.parameters()[0].tobytes().hex())"
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env=clean_env()) for _ in range(2)]
    for p in outs:
        assert p.returncode == 0, p.stderr
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.strip()


# ----------------------------------------------------------------------------------------- build_info


def test_build_info_keys_and_types():
    info = cx.build_info()
    expected_types = {
        "version": str,
        "compiler": str,
        "blas": str,
        "blas_threads": int,
        "blas_threads_policy": str,
        "cuda": bool,
        "nccl": bool,
    }
    for key, typ in expected_types.items():
        assert key in info, key
        assert type(info[key]) is typ, (key, info[key])
    # The CUDA library is built where nvcc, cuBLAS and NCCL were found (tests/gpu checks both cases).
    assert info["nccl"] is info["cuda"]
    assert (info["cuda_version"] is None) is (not info["cuda"]) or "could not be loaded" in info["cuda_note"]
    assert info["blas"].startswith("OpenBLAS")
    assert info["blas_threads"] >= 1
    assert info["blas_threads"] == cx.get_num_threads()
    assert info["blas_threads_policy"].startswith("BLAS threads:")
    assert info["compiler"]


def test_version_string_matches_build_info_and_metadata():
    assert isinstance(cx.__version__, str)
    assert cx.__version__ == cx.build_info()["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?\w+)*", cx.__version__)
    assert cx.__version__ == importlib.metadata.version("pycyxwiz")


def test_model_format_error_is_a_value_error():
    assert issubclass(cx.ModelFormatError, ValueError)


# ----------------------------------------------------------------------------------- BLAS thread policy


def _threads_in_fresh_process(**extra):
    code = "import pycyxwiz as cx; print(cx.get_num_threads()); print(cx.build_info()['blas_threads_policy'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=clean_env(**extra))  # no inherited thread count or world size
    assert proc.returncode == 0, proc.stderr
    count, policy = proc.stdout.strip().split("\n", 1)
    return int(count), policy


@pytest.fixture(scope="module")
def single_process_threads():
    count, policy = _threads_in_fresh_process()
    assert "single process" in policy
    return count


def test_single_process_keeps_all_blas_threads(single_process_threads):
    assert single_process_threads >= 1
    assert single_process_threads == min(os.cpu_count(), single_process_threads)
    count, _ = _threads_in_fresh_process(WORLD_SIZE="1")
    assert count == single_process_threads


@pytest.mark.parametrize(
    "var,value",
    [("WORLD_SIZE", "2"), ("SLURM_NTASKS", "4"), ("OMPI_COMM_WORLD_SIZE", "2"), ("PMI_SIZE", "8")],
)
def test_multi_rank_launch_uses_one_blas_thread(var, value):
    count, policy = _threads_in_fresh_process(**{var: value})
    assert count == 1
    assert f"{var}={value}" in policy


def test_cyxwiz_num_threads_wins_over_world_size():
    count, policy = _threads_in_fresh_process(CYXWIZ_NUM_THREADS="2", WORLD_SIZE="4")
    assert count == 2
    assert "CYXWIZ_NUM_THREADS" in policy
    count, _ = _threads_in_fresh_process(CYXWIZ_NUM_THREADS="1")
    assert count == 1


def test_openblas_variables_are_respected_under_a_launcher(single_process_threads):
    count, policy = _threads_in_fresh_process(OPENBLAS_NUM_THREADS="2", WORLD_SIZE="4")
    assert count == min(2, single_process_threads)
    assert "OPENBLAS_NUM_THREADS" in policy
    count, _ = _threads_in_fresh_process(OMP_NUM_THREADS="1", WORLD_SIZE="4")
    assert count == 1


def _import_error(value):
    code = textwrap.dedent(
        """
        try:
            import pycyxwiz
        except BaseException as e:
            print(type(e).__name__ + ":" + ",".join(c.__name__ for c in type(e).__mro__))
            print(e)
        else:
            print("IMPORTED")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=clean_env(CYXWIZ_NUM_THREADS=value))
    assert proc.returncode == 0, proc.stderr
    assert not proc.stdout.startswith("IMPORTED"), f"import succeeded with CYXWIZ_NUM_THREADS={value!r}"
    kind, message = proc.stdout.split("\n", 1)
    return kind, message


@pytest.mark.parametrize("value", ["abc", "0", "-3", "2x", "99999"])
def test_invalid_cyxwiz_num_threads_fails_import_naming_the_variable(value):
    _, message = _import_error(value)
    assert "CYXWIZ_NUM_THREADS" in message
    assert repr(value) in message


def test_invalid_cyxwiz_num_threads_raises_value_error():
    kind, message = _import_error("abc")
    assert "ValueError" in kind.split(":")[1].split(","), f"{kind.split(':')[0]}: {message}"


def test_empty_cyxwiz_num_threads_counts_as_unset(single_process_threads):
    count, _ = _threads_in_fresh_process(CYXWIZ_NUM_THREADS="")
    assert count == single_process_threads


def test_set_num_threads_validates_and_applies():
    original = cx.get_num_threads()
    try:
        for bad in (0, -1):
            with pytest.raises(ValueError, match="threads"):
                cx.set_num_threads(bad)
            assert cx.get_num_threads() == original
        cx.set_num_threads(1)
        assert cx.get_num_threads() == 1
        assert cx.build_info()["blas_threads"] == 1
        # Results do not depend on the thread count.
        model = mlp()
        x = batch(64)
        one = model.forward(x)
        cx.set_num_threads(max(2, original))
        np.testing.assert_allclose(model.forward(x), one, rtol=1e-6, atol=1e-7)
    finally:
        cx.set_num_threads(original)
    assert cx.get_num_threads() == original


def test_rng_state_round_trip_replays_the_same_draws():
    cx.manual_seed(123)
    cx.LinearModule(5, 5)  # advance the stream
    state = cx.get_rng_state()
    first = [p.copy() for p in cx.LinearModule(7, 3).parameters()]
    drop = cx.DropoutModule(0.5)
    mask_first = drop.forward(np.ones((4, 16), np.float32))
    cx.set_rng_state(state)
    second = [p.copy() for p in cx.LinearModule(7, 3).parameters()]
    mask_second = drop.forward(np.ones((4, 16), np.float32))
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    assert np.array_equal(mask_first, mask_second)
    # A different state gives different draws, so the equality above is not vacuous.
    cx.manual_seed(124)
    third = [p.copy() for p in cx.LinearModule(7, 3).parameters()]
    assert not np.array_equal(first[0], third[0])


@pytest.mark.parametrize("bad", [b"", b"not a state", b"1 2 3"])
def test_set_rng_state_rejects_garbage(bad):
    state = cx.get_rng_state()
    with pytest.raises(ValueError, match="get_rng_state"):
        cx.set_rng_state(bad)
    assert cx.get_rng_state() == state  # unchanged


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_tensor_exports_the_buffer_protocol_without_copying(dtype):
    a = np.arange(12, dtype=dtype).reshape(3, 4)
    t = cx.Tensor(a)
    view = memoryview(t)
    assert view.shape == (3, 4) and view.itemsize == np.dtype(dtype).itemsize
    b = np.frombuffer(view, dtype=np.dtype(view.format)).reshape(view.shape)
    assert np.shares_memory(a, b)
    a[1, 2] = 99
    assert b[1, 2] == 99


# ---------------------------------------------------------------------------------------- DLPack

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_dlpack_export_shares_memory_with_numpy_and_torch(dtype):
    a = np.arange(24, dtype=dtype).reshape(2, 3, 4)
    t = cx.Tensor(a)
    assert t.__dlpack_device__() == (1, 0)
    n = np.from_dlpack(t)
    assert n.dtype == a.dtype and n.shape == a.shape and np.shares_memory(n, a)
    a[1, 2, 3] = 99
    assert n[1, 2, 3] == 99, "numpy.from_dlpack made a copy"
    torch = pytest.importorskip("torch")
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == a.ctypes.data and tuple(tt.shape) == a.shape
    del t, n
    assert tt[1, 2, 3].item() == 99, "the exported memory must outlive the cx.Tensor"


def test_dlpack_export_copy_and_device_requests():
    a = np.ones((2, 2), np.float32)
    copied = np.from_dlpack(cx.Tensor(a), copy=True)
    assert not np.shares_memory(copied, a) and np.array_equal(copied, a)
    with pytest.raises(BufferError, match="is on cpu and is not copied to another device"):
        cx.Tensor(a).__dlpack__(dl_device=(2, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_from_dlpack_wraps_numpy_without_a_copy(dtype):
    a = np.arange(6, dtype=dtype).reshape(2, 3)
    t = cx.from_dlpack(a)
    assert isinstance(t, cx.Tensor) and t.shape == (2, 3) and t.dtype == np.dtype(dtype).name and t.device == "cpu"
    assert np.shares_memory(np.asarray(t), a)


def test_from_dlpack_of_torch_outlives_the_producer_and_feeds_a_model():
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    expected = x.numpy().copy()
    t = cx.from_dlpack(x)
    del x
    np.testing.assert_array_equal(np.asarray(t), expected)
    cx.manual_seed(0)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 3))
    np.testing.assert_allclose(model.forward(t), model.forward(expected), rtol=0, atol=0)


def test_from_dlpack_refuses_what_it_cannot_wrap():
    with pytest.raises(TypeError, match=r"from_dlpack: expected an object with __dlpack__"):
        cx.from_dlpack([1.0, 2.0])
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"DLPack dtype \(code 2, 16 bits\) is not supported; use float32"):
        cx.from_dlpack(torch.zeros(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="not C-contiguous; pass a contiguous copy"):
        cx.from_dlpack(torch.zeros(3, 4).t())
