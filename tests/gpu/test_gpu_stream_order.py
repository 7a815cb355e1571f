"""Memory and the streams that use it (issue 14 items 3, 5 and 9), under the host emulator
(tests/gpu/emulator): its streams run asynchronously on worker threads, freed memory is poisoned,
and every kernel, copy and collective checks, when it runs, that what it touches is still allocated.
A use after free that a GPU would turn into silent corruption is counted there
(cxemu_test_errors) and breaks the context (the next synchronising call fails, as a GPU's sticky
error would: so the test that can break it runs last in this process, or in a process of its own). On a real GPU the same bugs need a race to show; these run only under the emulator.

  * memory imported from another library (__cuda_array_interface__, DLPack) is handed back only after
    the kernels queued on it ran;
  * a dropped, unfinished async collective's buffers are freed behind its event;
  * the library allocates from a memory pool of its own, leaving the device's default pool (shared
    with CuPy, PyTorch...) as it found it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np
import pytest
from gpu_support import requires_gpu
from harness import free_port, rank_env

import pycyxwiz as cx

LIBRARY = os.environ.get("CYXWIZ_CUDA_LIBRARY", "")
EMULATED = LIBRARY.endswith("libcyxwiz_cuda_emulated.so")
pytestmark = [requires_gpu, pytest.mark.skipif(not EMULATED, reason="needs the host emulator's use-after-free checks")]


@pytest.fixture(scope="module")
def emu():
    lib = ctypes.CDLL(LIBRARY)  # the library the engine loaded: dlopen returns the same handle
    lib.cxemu_test_foreign_alloc.restype = ctypes.c_void_p
    lib.cxemu_test_foreign_alloc.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.cxemu_test_foreign_release.argtypes = [ctypes.c_void_p]
    lib.cxemu_test_errors.restype = ctypes.c_int
    lib.cxemu_test_default_pool_modified.argtypes = [ctypes.c_int]
    lib.cxemu_test_stream_read.restype = ctypes.c_size_t
    lib.cxemu_test_stream_read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def busy_model():
    """A layer whose forward on a big batch keeps the emulated compute stream busy for a while."""
    cx.manual_seed(0)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(256, 256))
    m.to("cuda")
    return m, cx.Tensor(np.ones((256, 256), np.float32)).to("cuda")


class Foreign:
    """Another library's GPU array whose memory that library reuses as soon as the last reference
    goes (a caching allocator): the emulator poisons it at once."""

    def __init__(self, emu, rows, cols):
        self.emu = emu
        self.ptr = emu.cxemu_test_foreign_alloc(0, rows * cols * 4)
        assert self.ptr
        self.__cuda_array_interface__ = {"shape": (rows, cols), "typestr": "<f4", "data": (self.ptr, False),
                                         "version": 3, "stream": None}

    def __del__(self):
        self.emu.cxemu_test_foreign_release(ctypes.c_void_p(self.ptr))


def test_the_library_leaves_the_default_memory_pool_alone(emu):
    t = cx.Tensor(np.ones(1000, np.float32)).to("cuda")
    (t.numpy() + 1).sum()
    assert emu.cxemu_test_default_pool_modified(0) == 0, "the release threshold of cuda:0's default pool was changed"


def test_imported_memory_is_released_after_the_kernels_that_read_it(emu):
    before = emu.cxemu_test_errors()
    model, big = busy_model()
    for _ in range(3):
        model.forward(big)           # queued: the stream is busy
        model.forward(Foreign(emu, 64, 256))  # the only reference to the foreign array goes with the call
    cx.cuda.synchronize(0)
    assert emu.cxemu_test_errors() == before, "a kernel read imported memory after its owner reused it"


class _DLManaged(ctypes.Structure):
    # DLManagedTensor: DLTensor (data, device, ndim, dtype, shape, strides, byte_offset), manager_ctx, deleter.
    _fields_ = [("data", ctypes.c_void_p), ("device", ctypes.c_int32 * 2), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint8 * 4), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def consume_and_release(capsule):
    """What a DLPack consumer does when its tensor dies: mark the capsule used, call the deleter."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    rename = ctypes.pythonapi.PyCapsule_SetName
    rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor")
    rename(capsule, b"used_dltensor")
    managed = _DLManaged.from_address(address)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(address)


def test_an_exported_tensor_is_freed_after_the_consumers_stream(emu):
    """__dlpack__(stream=S): the consumer's kernels on S may still read the memory when it lets go; our
    stream-ordered free must come after them."""
    before = emu.cxemu_test_errors()
    t = cx.Tensor(np.ones(1 << 16, np.float32)).to("cuda")
    ptr = t.__cuda_array_interface__["data"][0]
    stream = emu.cxemu_test_stream_read(0, ptr, 4 << 16, 300)  # the consumer's kernel, queued on S
    assert stream
    capsule = t.__dlpack__(stream=stream)
    del t
    consume_and_release(capsule)  # the consumer's tensor died; its kernel has not run yet
    cx.cuda.synchronize(0)
    assert emu.cxemu_test_stream_synchronize(ctypes.c_size_t(stream)) == 0
    assert emu.cxemu_test_errors() == before, "our free ran before the consumer's stream finished reading"


def test_a_dropped_unfinished_collective_frees_its_buffer_after_the_collective(tmp_path):
    """All-reduce with async_op=True, then the Work and the tensor dropped before the collective ran:
    the buffer must outlive the collective on the communication stream."""
    script = tmp_path / "drop.py"
    script.write_text(r'''
import ctypes, json, os
import numpy as np
import pycyxwiz as cx
D = cx.distributed
emu = ctypes.CDLL(os.environ["CYXWIZ_CUDA_LIBRARY"])
D.init()
model = cx.SequentialModel(); model.add(cx.LinearModule(256, 256)); model.to("cuda")
big = cx.Tensor(np.ones((256, 256), np.float32)).to("cuda")
out = {"errors_before": emu.cxemu_test_errors()}
for i in range(10):
    model.forward(big)  # the compute stream is busy; the collective waits for it
    t = cx.Tensor(np.full(4096, float(i), np.float32)).to("cuda")
    w = D.all_reduce(t, async_op=True)
    del t, w
try:
    cx.cuda.synchronize(0)
    kept = cx.Tensor(np.arange(8, dtype=np.float32)).to("cuda")
    D.all_reduce(kept)
    out["after"] = kept.numpy().tolist()
except Exception as e:  # noqa: BLE001 - reported to the test
    out["error"] = f"{type(e).__name__}: {e}"
out["errors_after"] = emu.cxemu_test_errors()
print("RESULT " + json.dumps(out), flush=True)
D.finalize()
''')
    import subprocess
    env = rank_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   DISTRIBUTED_BACKEND="nccl")
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    r = json.loads(lines[-1][7:])
    assert "error" not in r, r
    assert r["errors_after"] == r["errors_before"], f"a collective used a freed buffer:\n{p.stderr[-3000:]}"
    assert r["after"] == list(range(8)), r
