"""cx.cuda's device queries and cx.Tensor on a GPU: copies to and from the device keep every dtype,
shape and bit; a GPU tensor refuses the buffer protocol and offers __cuda_array_interface__ instead.
Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason())."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gpu_support import GPU_COUNT, requires_gpu

import pycyxwiz as cx

pytestmark = requires_gpu

DTYPES = ["float32", "float64", "int32", "int64"]


def test_cuda_queries():
    assert cx.cuda.is_available() is True
    assert cx.cuda.device_count() == GPU_COUNT >= 1
    assert cx.cuda.unavailable_reason() is None
    for i in range(GPU_COUNT):
        name = cx.cuda.get_device_name(i)
        assert isinstance(name, str) and name.strip(), repr(name)
        major, minor = cx.cuda.get_device_capability(i)
        assert isinstance(major, int) and isinstance(minor, int) and major >= 3 and minor >= 0, (major, minor)
        props = cx.cuda.get_device_properties(i)
        assert {"name", "major", "minor", "total_memory", "multi_processor_count"} <= props.keys(), props
        assert props["name"] == name and (props["major"], props["minor"]) == (major, minor), props
        assert props["total_memory"] > 2**30 and props["multi_processor_count"] > 0, props
        assert cx.cuda.synchronize(i) is None
    assert cx.cuda.get_device_name() == cx.cuda.get_device_name(0)


def test_cuda_queries_on_a_missing_device_raise_value_error():
    for call in (cx.cuda.get_device_name, cx.cuda.get_device_capability, cx.cuda.get_device_properties,
                 cx.cuda.synchronize):
        with pytest.raises(ValueError) as e:
            call(GPU_COUNT)
        assert f"cuda:{GPU_COUNT} requested, but {GPU_COUNT} GPU" in str(e.value), str(e.value)


def test_build_info_of_a_cuda_build():
    info = cx.build_info()
    assert info["cuda"] is True and info["nccl"] is True, info
    assert re.fullmatch(r"\d+\.\d+", info["cuda_version"]), info
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["nccl_version"]), info
    assert info["cublas_version"], info
    assert info["cudnn_version"] >= 90000, f"the GPU build has no cuDNN 9 (convolutions cannot run): {info}"
    assert info["cuda_architectures"], info
    assert isinstance(info["cuda_note"], str) and info["cuda_note"], info


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 5), (2, 3, 4), (1000, 257)])
def test_tensor_round_trip_through_the_gpu(dtype, shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 1000).astype(dtype)
    host = cx.Tensor(a)
    t = host.to("cuda")
    assert t.is_cuda and t.device == "cuda:0" and not host.is_cuda and host.device == "cpu"
    assert t.shape == shape and t.dtype == dtype and t.numel() == a.size and t.ndim == len(shape)
    for back in (t.numpy(), np.asarray(t), np.array(t), t.cpu().numpy(), t.to("cpu").numpy()):
        assert isinstance(back, np.ndarray) and back.dtype == np.dtype(dtype) and back.shape == shape
        assert np.array_equal(back, a), "the bits changed on the way through the GPU"
    assert t.to("cuda:0").device == "cuda:0" and np.array_equal(t.to("cuda").numpy(), a)
    a[...] = 0  # the GPU copy does not alias the numpy array
    assert shape == (0,) or not np.array_equal(t.numpy(), a)
    assert "device=cuda:0" in repr(t), repr(t)


def test_gpu_tensor_host_copies_are_copies():
    t = cx.Tensor(np.arange(6, dtype=np.float32)).to("cuda")
    h = t.numpy()
    h[:] = -1
    assert np.array_equal(t.numpy(), np.arange(6)), "writing a host copy changed the GPU tensor"


def test_gpu_tensor_refuses_the_buffer_protocol():
    t = cx.Tensor(np.ones((2, 3), np.float32)).to("cuda")
    with pytest.raises(BufferError):  # pybind11 reports a refused buffer as BufferError
        memoryview(t)
    np.testing.assert_array_equal(np.asarray(t), np.ones((2, 3), np.float32))  # __array__ copies instead


def test_cuda_array_interface():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = cx.Tensor(a).to("cuda")
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (3, 4) and cai["typestr"] == "<f4" and cai["version"] == 3, cai
    ptr, read_only = cai["data"]
    assert isinstance(ptr, int) and ptr != 0 and read_only is False, cai
    assert cai.get("strides") is None, "C-contiguous: strides None"
    assert t.__cuda_array_interface__["data"][0] == ptr, "the pointer moved between two reads"
    for dtype, typestr in (("float64", "<f8"), ("int32", "<i4"), ("int64", "<i8")):
        assert cx.Tensor(np.zeros(2, dtype)).to("cuda").__cuda_array_interface__["typestr"] == typestr
    assert not hasattr(cx.Tensor(a), "__cuda_array_interface__"), "a host tensor must not offer it"


def test_tensor_to_a_missing_gpu_raises_value_error():
    with pytest.raises(ValueError) as e:
        cx.Tensor(np.ones(3, np.float32)).to(f"cuda:{GPU_COUNT}")
    assert f"cuda:{GPU_COUNT} requested" in str(e.value) and "visible" in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        cx.Tensor(np.ones(3, np.float32)).to("tpu")


class _Producer:
    """A foreign GPU array: another library's __cuda_array_interface__ over memory it owns."""

    def __init__(self, owner, stream):
        self.owner = owner  # keeps the memory alive
        self.__cuda_array_interface__ = dict(owner.__cuda_array_interface__, stream=stream)


@pytest.mark.parametrize("stream", [None, 1, 2])
def test_foreign_gpu_arrays_are_read_in_place_after_their_stream(stream):
    # Version 3 of the interface names the producer's stream; the engine orders its reads after it
    # (1 and 2: the legacy and per-thread default streams, as CuPy and PyTorch report them).
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    cx.manual_seed(0)
    model = cx.SequentialModel()
    model.add(cx.LinearModule(4, 3))
    expected = model.forward(x)
    model.to("cuda")
    out = model.forward(_Producer(cx.Tensor(x).to("cuda"), stream))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-6)
    target = cx.Tensor(np.array([0, 1, 2, 0, 1], np.int64)).to("cuda")
    loss = cx.CrossEntropyLoss()
    assert loss.forward(out, _Producer(target, stream)) == pytest.approx(loss.forward(expected, np.array([0, 1, 2, 0, 1])),
                                                                         rel=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_dlpack_round_trip_of_a_gpu_tensor_shares_its_memory(dtype):
    """A GPU cx.Tensor through __dlpack__ / cx.from_dlpack: the same device memory (no copy), the
    device reported as (kDLCUDA, 0), and the memory kept alive by the capsule's owner."""
    a = np.arange(12, dtype=dtype).reshape(3, 4)
    g = cx.Tensor(a).to("cuda:0")
    assert g.__dlpack_device__() == (2, 0)
    h = cx.from_dlpack(g)
    assert h.is_cuda and h.device == "cuda:0" and h.shape == (3, 4) and h.dtype == np.dtype(dtype).name
    assert h.__cuda_array_interface__["data"][0] == g.__cuda_array_interface__["data"][0], "from_dlpack copied"
    np.testing.assert_array_equal(h.numpy(), a)
    del g
    np.testing.assert_array_equal(h.numpy(), a)  # the capsule's owner keeps the memory alive
