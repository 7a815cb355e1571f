"""Without a usable GPU (a CPU-only build, or a CUDA build on a machine without a driver or a GPU):
cx.cuda says so and why, never raises from is_available/device_count, every request for a GPU fails
with a RuntimeError that names the reason and the CPU remedy, and the model it was asked of keeps
training on the CPU exactly as before. DISTRIBUTED_BACKEND=nccl fails at init() with a
DistBackendError for the build's case. `import pycyxwiz` maps no CUDA library at all; a CUDA build
loads its libcyxwiz_cuda.so only when a GPU question is asked.

The whole module is skipped where a GPU is usable (tests/gpu/test_gpu_*.py cover that machine).
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest
from gpu_support import COLLECTIVES_PRELUDE, collective_reports
from harness import free_port, rank_env

import pycyxwiz as cx

D = cx.distributed

pytestmark = pytest.mark.skipif(
    cx.cuda.is_available(),
    reason=f"a GPU is usable here ({cx.cuda.device_count()} visible): these tests are for machines without one")

BUILT = bool(cx.build_info()["cuda"])  # a CUDA build (on a machine without a usable GPU)
REMEDY = 'or train on the CPU (model.to("cpu"), DISTRIBUTED_BACKEND=cpu)'
# What unavailable_reason() starts with in a CUDA build: the driver is missing or refuses
# (cudaGetDeviceCount failed), or it works but shows no GPU.
NO_GPU_REASON = re.compile(r"^(no usable GPU: |no GPU is visible \(CUDA_VISIBLE_DEVICES=)")


def build_note() -> str:
    """Why CMake built no CUDA library (CYXWIZ_CUDA=OFF, no nvcc, ...): build_info's note minus its prefix."""
    note = cx.build_info()["cuda_note"]
    assert note.startswith("CPU-only build: "), note
    return note[len("CPU-only build: "):]


def build(seed: int = 7) -> cx.SequentialModel:
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(12, 16))
    m.add(cx.ReLUModule())
    m.add(cx.DropoutModule(0.25))
    m.add(cx.LinearModule(16, 4))
    return m


def train(model: cx.SequentialModel, steps: int = 3) -> list[np.ndarray]:
    """A few SGD steps on fixed data; returns copies of the parameters, the loss and the input gradient."""
    opt = cx.SGDOptimizer(0.1, momentum=0.9)
    loss_fn = cx.CrossEntropyLoss()
    rng = np.random.default_rng(5)
    out = []
    for _ in range(steps):
        x = rng.standard_normal((8, 12)).astype(np.float32)
        y = rng.integers(0, 4, 8)
        logits = model.forward(x)
        assert isinstance(logits, np.ndarray), f"a CPU model returned {type(logits).__name__}"
        model.zero_grad()
        dx = model.backward(loss_fn.backward(logits, y), input_grad=True)
        assert isinstance(dx, np.ndarray)
        out += [np.float32(loss_fn.forward(logits, y)), np.array(dx, copy=True)]
        opt.step(model)
    return out + [np.array(p, copy=True) for p in model.parameters()]


# ---- cx.cuda ------------------------------------------------------------------------------------

def test_is_available_is_false_and_device_count_zero():
    for _ in range(2):  # the answer is cached, not recomputed into an exception the second time
        assert cx.cuda.is_available() is False
        assert cx.cuda.device_count() == 0
        assert isinstance(cx.cuda.device_count(), int)


def test_unavailable_reason_says_which_case():
    why = cx.cuda.unavailable_reason()
    assert isinstance(why, str) and why.strip(), repr(why)
    assert why == cx.cuda.unavailable_reason(), "the reason changed between two calls"
    if BUILT:
        assert "built without CUDA" not in why, f"a CUDA build says it was built without CUDA: {why}"
        assert NO_GPU_REASON.search(why), (
            f"a CUDA build without a usable GPU should say the driver/GPU is missing "
            f"('no usable GPU: cudaGetDeviceCount failed: ...' or 'no GPU is visible (...)'), got: {why}")
    else:
        assert why.startswith("this pycyxwiz was built without CUDA ("), why
        assert build_note() in why, f"the reason does not carry build_info's note {build_note()!r}: {why}"
        assert "rebuild" in why and "nvidia-nccl-cu13" in why, f"no way to get a CUDA build is named: {why}"


def test_build_info_cuda_fields():
    info = cx.build_info()
    keys = {"cuda", "cuda_version", "nccl", "nccl_version", "cublas_version", "cudnn_version", "cuda_architectures",
            "cuda_note"}
    assert keys <= info.keys(), f"missing: {sorted(keys - info.keys())}"
    assert type(info["cuda"]) is bool and type(info["nccl"]) is bool, info
    assert isinstance(info["cuda_note"], str) and info["cuda_note"], info
    assert not info["nccl"] or info["cuda"], f"NCCL without CUDA: {info}"
    versions = ("cuda_version", "nccl_version", "cublas_version", "cudnn_version", "cuda_architectures")
    if not info["cuda"]:
        assert info["nccl"] is False, info
        assert all(info[k] is None for k in versions), f"a CPU-only build reports versions: {info}"
        assert info["cuda_note"].startswith("CPU-only build: ") and build_note(), info
        return
    if info["cuda_version"] is None:  # the library did not load: every version unknown, the note says why
        assert all(info[k] is None for k in versions), info
        assert info["cuda_note"] != "CUDA build", info
        return
    # The library loaded (it needs no driver for its versions).
    assert re.fullmatch(r"\d+\.\d+", info["cuda_version"]), info
    assert info["nccl"] is True and re.fullmatch(r"\d+\.\d+\.\d+", info["nccl_version"]), info
    assert isinstance(info["cublas_version"], (int, str)) and not isinstance(info["cublas_version"], bool), info
    assert type(info["cudnn_version"]) is int and info["cudnn_version"] >= 0, info  # 0: built without cuDNN
    # The architectures CMake compiled for ("80-real", "90-virtual", ...), as a list or one string.
    archs = info["cuda_architectures"]
    assert archs and (isinstance(archs, str) or all(isinstance(a, str) and a for a in archs)), info


@pytest.mark.parametrize("call", ["get_device_name", "get_device_capability", "get_device_properties", "synchronize"])
def test_device_queries_raise_with_the_reason(call):
    with pytest.raises(RuntimeError) as e:
        getattr(cx.cuda, call)(0)
    assert cx.cuda.unavailable_reason() in str(e.value), str(e.value)
    assert "cuda:0 requested, but" in str(e.value), str(e.value)


def test_tf32_is_off_by_default_and_the_flag_round_trips():
    assert cx.cuda.is_tf32_enabled() is False, "TF32 must be off by default"
    try:
        cx.cuda.set_tf32(True)  # no GPU: only the setting (it applies when a GPU is used)
        assert cx.cuda.is_tf32_enabled() is True
    finally:
        cx.cuda.set_tf32(False)
    assert cx.cuda.is_tf32_enabled() is False


# ---- model.to / Tensor.to -----------------------------------------------------------------------

@pytest.mark.parametrize("device, shown", [("cuda", "cuda:0"), ("cuda:0", "cuda:0"), ("cuda:1", "cuda:1"),
                                           ("gpu", "cuda:0"), ("CUDA", "cuda:0")])
def test_model_to_gpu_raises_and_the_model_keeps_training_on_the_cpu(device, shown):
    model = build()
    before = [np.array(p, copy=True) for p in model.parameters()]
    with pytest.raises(RuntimeError) as e:
        model.to(device)
    msg = str(e.value)
    assert not isinstance(e.value, ValueError), msg
    assert f"{shown} requested, but " in msg, msg
    assert cx.cuda.unavailable_reason() in msg, f"the reason is not in the message: {msg}"
    assert "DISTRIBUTED_BACKEND=cpu" in msg and 'model.to("cpu")' in msg, msg
    # Nothing moved, nothing changed, and it trains exactly as an identical model that never tried.
    assert model.device == "cpu"
    assert all(np.array_equal(p, q) for p, q in zip(model.parameters(), before))
    cx.manual_seed(11)  # the dropout masks of both runs
    got = train(model)
    fresh = build()
    cx.manual_seed(11)
    want = train(fresh)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"item {i} differs from a fresh identical model's after the failed move"
    assert model.to("cpu") is model and model.device == "cpu"


def test_model_to_gpu_message_names_the_remedy_once():
    """The reason of a CPU-only build already ends with the remedy; the message must not repeat it."""
    with pytest.raises(RuntimeError) as e:
        build().to("cuda")
    msg = str(e.value)
    assert msg.count("or train on the CPU") == 1, f"the remedy appears {msg.count('or train on the CPU')} times: {msg}"
    assert msg.count(REMEDY) == 1, msg


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:", "cuda:-1", "cuda0", " cuda", "", "cuda:0:1"])
def test_unknown_device_strings_raise_value_error(device):
    model = build()
    with pytest.raises(ValueError) as e:
        model.to(device)
    assert f"unknown device '{device}'" in str(e.value) and '"cuda:N"' in str(e.value), str(e.value)
    assert model.device == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        cx.Tensor(np.ones(3, np.float32)).to(device)


def test_tensor_to_cuda_raises_and_host_tensors_stay_host():
    t = cx.Tensor(np.arange(3, dtype=np.float32))
    for device in ("cuda", "cuda:0", "gpu"):
        with pytest.raises(RuntimeError) as e:
            t.to(device)
        assert "Tensor.to: cuda:0 requested, but " in str(e.value), str(e.value)
        assert cx.cuda.unavailable_reason() in str(e.value) and "DISTRIBUTED_BACKEND=cpu" in str(e.value), str(e.value)
    assert t.device == "cpu" and t.is_cuda is False
    assert not hasattr(t, "__cuda_array_interface__"), "a host tensor must not offer __cuda_array_interface__"
    for host in (t.to("cpu"), t.cpu()):
        assert host.device == "cpu" and not host.is_cuda
        assert np.array_equal(np.asarray(host), [0, 1, 2])


# ---- distributed ----------------------------------------------------------------------------------

NCCL_INIT = COLLECTIVES_PRELUDE + r'''
import pycyxwiz as cx

why = cx.cuda.unavailable_reason()
messages = []
# From the environment (DISTRIBUTED_BACKEND=nccl), then from an explicit config.
cfg = dist.DistributedConfig.from_environment()
expect(cfg.backend == dist.BackendType.NCCL, f"DISTRIBUTED_BACKEND=nccl read as {cfg.backend}")
explicit = dist.DistributedConfig()  # a world of one, the backend chosen in code
explicit.master_port = cfg.master_port
explicit.backend = dist.BackendType.NCCL
for name, args in (("env", ()), ("config", (explicit,))):
    t0 = time.monotonic()
    e = expect_raises(dist.DistBackendError, dist.init, *args, contains=["DISTRIBUTED_BACKEND=cpu"])
    messages.append({"how": name, "cls": type(e).__name__, "msg": str(e), "elapsed": time.monotonic() - t0})
    expect(not dist.is_initialized(), f"{name}: is_initialized() after the failed init")

# The remedy works in the same process: the CPU backend, then a collective.
cpu = dist.DistributedConfig.from_environment()
cpu.backend = dist.BackendType.CPU
dist.init(cpu)
expect(dist.get_backend() == "cpu", f"backend {dist.get_backend()}")
x = np.arange(5, dtype=np.float32)
dist.all_reduce(x)
expect(np.array_equal(x, np.arange(5)), f"all_reduce at world size 1: {x}")
report["why"] = why
report["messages"] = messages
report["maps"] = [l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l] if os.path.exists("/proc/self/maps") else []
done()
'''


def test_nccl_backend_init_fails_with_dist_backend_error(ranks):
    results = ranks.run(NCCL_INIT, 1, env={"DISTRIBUTED_BACKEND": "nccl", "DISTRIBUTED_TIMEOUT_MS": "5000"},
                        timeout=60)
    [rep] = collective_reports(ranks, results, 1)
    assert len(rep["messages"]) == 2, rep
    for m in rep["messages"]:
        msg = m["msg"]
        assert m["cls"] == "DistBackendError", m
        assert m["elapsed"] < 10, f"init took {m['elapsed']:.1f} s to refuse NCCL: it should not wait for anything"
        if BUILT:
            assert msg.startswith("init: ") and "DISTRIBUTED_BACKEND=nccl" in msg and "rank 0" in msg, msg
            assert rep["why"] in msg, f"the reason ({rep['why']}) is not in: {msg}"
            assert "built without" not in msg and "has no NCCL backend" not in msg, msg
        else:
            assert msg.startswith("init: this pycyxwiz build has no NCCL backend ("), msg
            assert build_note() in msg and "BackendType.CPU" in msg, msg
        assert "DISTRIBUTED_BACKEND=cpu" in msg, msg
    if not BUILT:
        assert rep["maps"] == [], f"a CPU-only build mapped NCCL: {rep['maps']}"


# ---- what `import pycyxwiz` loads ----------------------------------------------------------------

GPU_LIBRARY = re.compile(r"/(libcyxwiz_cuda\.so|libcuda\.so|libcudart\.so|libcublas(Lt)?\.so|libnccl\.so)[^/]*$")

MAPS = r'''
import json, os, sys
import numpy as np
import pycyxwiz as cx
STAGE = sys.argv[1]


def mapped():
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if len(l.split()) >= 6})


seen = {"import": mapped()}
if STAGE in ("cpu_training", "is_available"):
    # CPU training, a CPU collective at world size 1, a checkpoint round trip: none needs CUDA.
    cx.manual_seed(0)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(6, 5)); m.add(cx.GELUModule()); m.add(cx.DropoutModule(0.1)); m.add(cx.LinearModule(5, 3))
    opt = cx.AdamOptimizer(0.01)
    x = np.ones((4, 6), np.float32)
    out = m.forward(x)
    m.backward(cx.CrossEntropyLoss().backward(out, np.array([0, 1, 2, 0])))
    opt.step(m)
    m.save("m.cyxmodel")
    cx.SequentialModel.load("m.cyxmodel").forward(x)
    cx.distributed.init()
    cx.distributed.all_reduce(np.ones(3, np.float32))
    cx.distributed.finalize()
    seen["cpu_training"] = mapped()
if STAGE == "is_available":
    seen["available"] = cx.cuda.is_available()
    seen["is_available"] = mapped()
print("MAPS " + json.dumps(seen))
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)")
@pytest.mark.parametrize("stage", ["import", "cpu_training", "is_available"])
def test_import_and_cpu_training_map_no_cuda_library(ranks, tmp_path, stage):
    script = tmp_path / "maps.py"
    script.write_text(MAPS)
    env = rank_env(RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    out, err = ranks.command([sys.executable, script, stage], env, timeout=60)
    lines = [line for line in out.splitlines() if line.startswith("MAPS ")]
    assert lines, out + err
    seen = json.loads(lines[-1][len("MAPS "):])
    for when in ("import", "cpu_training"):
        if when in seen:
            gpu = [p for p in seen[when] if GPU_LIBRARY.search(p)]
            assert gpu == [], f"after {when}, this process maps CUDA libraries: {gpu}"
    if stage == "is_available":
        assert seen["available"] is False
        ours = [p for p in seen["is_available"] if p.endswith("/libcyxwiz_cuda.so")]
        if BUILT:
            # The question loads the library (which then asks the driver); the answer is still False.
            assert ours, "cx.cuda.is_available() in a CUDA build did not load libcyxwiz_cuda.so"
            assert os.path.dirname(ours[0]) == os.path.dirname(cx._core.__file__), (ours, cx._core.__file__)
        else:
            gpu = [p for p in seen["is_available"] if GPU_LIBRARY.search(p)]
            assert gpu == [], f"a CPU-only build mapped CUDA libraries: {gpu}"

