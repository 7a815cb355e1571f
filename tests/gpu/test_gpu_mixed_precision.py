"""Mixed precision is CPU-only in this version: a GPU model under cx.autocast, and a GradScaler over
GPU gradients, are refused with a message that says what to do (train the GPU model in float32).
The GPU path (cuBLASLt with 16-bit inputs and CUBLAS_COMPUTE_32F) is still to come."""

from __future__ import annotations

import numpy as np
import pytest

import pycyxwiz as cx


def gpu_model():
    m = cx.SequentialModel()
    m.add(cx.LinearModule(4, 8))
    m.add(cx.ReLUModule())
    m.add(cx.LinearModule(8, 3))
    m.to("cuda")
    return m


def test_autocast_refuses_a_gpu_model(gpu):
    m = gpu_model()
    x = np.ones((2, 4), np.float32)
    with cx.autocast("bfloat16"), pytest.raises(ValueError, match=r"on cuda:0: autocast .*CPU only.*float32"):
        m.forward(x)
    out = m.forward(x)   # outside autocast the GPU model trains as before
    assert np.asarray(out).shape == (2, 3)


def test_grad_scaler_refuses_gpu_gradients(gpu):
    m = gpu_model()
    loss = cx.CrossEntropyLoss()
    out = m.forward(np.ones((2, 4), np.float32))
    m.backward(loss.backward(out, np.array([0, 1])))
    with pytest.raises(ValueError, match=r"cuda:0.*CPU only"):
        cx.GradScaler().step(cx.SGDOptimizer(0.1), m)
