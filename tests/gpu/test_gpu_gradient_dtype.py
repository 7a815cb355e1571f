"""DDPConfig.gradient_dtype with the model on a GPU: the conversion kernels and the 16-bit exchange.

  * the kernels (cuda::Api::convertFloats, reached through cx._core._round_to_16 / _widen_16 with a
    device, which call DDP's own ddp::narrowGradients / widenGradients) give the host's bits
    (cyxwiz/tensor/half.h, itself checked against numpy and torch in
    tests/distributed/test_collective_dtypes.py) for every float16/bfloat16 and for float32 edge
    values: ties, subnormals, Inf/NaN (sign kept), float16 overflow to Inf, with DDP's 1/N scale;
  * 2 ranks: the exchanged gradients equal the exact numpy oracle of tests/distributed/
    test_gradient_dtype.py, over NCCL (two GPUs) and over the CPU backend with both ranks on one GPU.
    NCCL reduces 16-bit types itself, rounding after every operation, and its AVG of a float type
    pre-multiplies each contribution by 1/nranks (ncclDevPreMulSum). At two ranks that is the oracle,
    bit for bit: bfloat16(g0) / 2 and bfloat16(g1) / 2 are exact (halving a normal number), so their
    rounded sum is the rounded sum halved; float16 travels pre-divided and is summed (SUM of two
    rounds once). With more ranks NCCL's ring rounds at every hop, in its own order;
  * a CUDA-graph step (TrainStep(cuda_graphs=True)) on two NCCL ranks narrows, reduces and widens
    inside the graph: it trains as the eager steps with the same gradient_dtype, and not as float32.

Needs a usable GPU (skipped otherwise, with cx.cuda.unavailable_reason()); the two-rank NCCL cases need
two (CYXWIZ_EMULATED_GPUS=2 under the tests' emulator).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import DDP_PRELUDE, assert_same_digest, ddp_reports, requires_gpu, requires_two_gpus
from sixteen_bit import ORACLE
from test_collective_dtypes import _float32_cases

import pycyxwiz as cx

pytestmark = requires_gpu

round_to_16, widen_16 = cx._core._round_to_16, cx._core._widen_16


# ---- the conversion kernels against the host's conversions ----------------------------------------

def _differ(got: np.ndarray, want: np.ndarray, what: str) -> str:
    bad = np.flatnonzero(got != want)
    return f"{what}: {bad.size} of {got.size} differ; first at {bad[:5].tolist()}: {got[bad[:5]]} vs {want[bad[:5]]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3], ids=["scale-1", "scale-1/2", "scale-1/3"])
def test_narrowing_kernel_gives_the_hosts_bits(dtype, scale):
    """Every float32 case (random bits, every 16-bit value, ties between neighbours and their float32
    neighbours, edges): the kernel's 16-bit bits equal the host's, NaNs included (sign kept)."""
    x = _float32_cases()
    host = round_to_16(x, dtype, scale)
    gpu = round_to_16(x, dtype, scale, "cuda:0")
    assert gpu.dtype == np.uint16 and gpu.shape == x.shape
    assert np.array_equal(gpu, host), _differ(gpu, host, f"float32 x {scale:.4g} -> {dtype} on cuda:0 vs the host")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_widening_kernel_is_exact_for_every_16_bit_value(dtype):
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    host = widen_16(every, dtype)
    gpu = widen_16(every, dtype, "cuda:0")
    assert np.array_equal(gpu.view(np.uint32), host.view(np.uint32)), _differ(gpu.view(np.uint32), host.view(np.uint32),
                                                                             f"{dtype} -> float32 on cuda:0")
    # And back on the device: every number comes back as itself, a NaN as the host rounds it.
    back, nan = round_to_16(gpu, dtype, 1.0, "cuda:0"), np.isnan(gpu)
    assert np.array_equal(back[~nan], every[~nan]) and np.array_equal(back[nan], round_to_16(gpu[nan], dtype))


def test_narrowing_kernel_edges_spelled_out():
    """The cases a reader checks by hand (the sweep above has them all)."""
    f = np.float32
    x = np.array([2049, 2051, 65504, 65519.99, 65520, 1e10, -1e10, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-26,
                  np.inf, -np.inf, 0.0, -0.0], dtype=f)
    half = round_to_16(x, "float16", 1.0, "cuda:0").view(np.float16)
    want = np.array([2048, 2052, 65504, 65504, np.inf, np.inf, -np.inf, 2.0**-24, 0.0, 2.0**-24, 0.0,
                     np.inf, -np.inf, 0.0, -0.0], dtype=np.float16)   # ties to even; overflow to Inf
    assert np.array_equal(half.view(np.uint16), want.view(np.uint16)), (half, want)
    nan = np.array([np.nan, -np.nan], dtype=f)
    for dtype in ("float16", "bfloat16"):
        bits = round_to_16(nan, dtype, 0.5, "cuda:0")
        wide = widen_16(bits, dtype, "cuda:0")
        assert np.isnan(wide).all() and np.signbit(wide).tolist() == [False, True], (dtype, bits)
    # bfloat16: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (ties to even: 1); a little above rounds up.
    b = round_to_16(np.array([1 + 2.0**-8, 1 + 2.0**-8 + 2.0**-20, 3.4e38, -3.4e38], dtype=f), "bfloat16", 1.0, "cuda:0")
    assert b.tolist() == [0x3F80, 0x3F81, 0x7F80, 0xFF80], [hex(v) for v in b]
    assert round_to_16(np.zeros(0, f), "bfloat16", 1.0, "cuda:0").size == 0


# ---- the exchange between two ranks -----------------------------------------------------------------

EXACT = DDP_PRELUDE + ORACLE + r'''
wire, BACKEND = os.environ["TEST_WIRE"], os.environ["DISTRIBUTED_BACKEND"]
D.init()
expect(D.get_backend() == BACKEND, f"backend {D.get_backend()}")
DEV = f"cuda:{D.get_local_rank()}" if BACKEND == "nccl" else "cuda:0"


cfg = D.DDPConfig()
cfg.gradient_dtype = wire
cfg.bucket_size_mb = 0.01            # several buckets
model = build(0, hidden=64, extra=True)
if BACKEND == "cpu":
    model.to("cuda")                 # the CPU backend: the ranks share the GPU, the transport is the host's
ddp = D.DistributedDataParallel(model, cfg)
expect(model.device == DEV, f"model on {model.device}, expected {DEV}")
local = build(0, hidden=64, extra=True).to(DEV)   # the same parameters and GPU, no DDP: this rank's own gradients
for step in range(2):
    X, y = batch(step, 32)
    xs, ys = shard(X, 16), shard(y, 16)
    ddp.backward(LOSS.backward(ddp.forward(xs), ys))
    got = ddp.sync_gradients()
    local.zero_grad()
    local.backward(LOSS.backward(local.forward(xs), ys))
    mine = flat(local.gradients())
    g0, g1 = D.all_gather(mine)
    expect_exchanged(flat(got), g0, g1, wire, step)
    ddp.zero_grad()
finish(digest=digest(got))
'''


@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
@pytest.mark.parametrize("backend", [pytest.param("nccl", marks=requires_two_gpus), "cpu"],
                         ids=["nccl-2-gpus", "cpu-2-ranks-on-1-gpu"])
def test_two_ranks_exchange_exactly_the_16_bit_average(ranks, backend, wire):
    env = {"TEST_WIRE": wire, "DISTRIBUTED_BACKEND": backend}
    reports = ddp_reports(ranks, ranks.run(EXACT, 2, env=env, timeout=90), 2)
    assert_same_digest(reports)


GRAPHED = DDP_PRELUDE + r'''
wire = os.environ["TEST_WIRE"]
D.init()
expect(D.get_backend() == "nccl", f"backend {D.get_backend()}")
rng = np.random.RandomState(9)
X = rng.standard_normal((2 * (8 * 16 + 5), 20)).astype(np.float32)   # per rank 8 full batches of 16 and one of 5
y = rng.randint(0, 5, len(X)).astype(np.int64)
mine = slice(RANK * (len(X) // 2), (RANK + 1) * (len(X) // 2))
Xr, yr = X[mine], y[mine]
result = {}
for name, dtype, graphs in (("float32", "float32", False), ("eager", wire, False), ("graphed", wire, True)):
    cfg = D.DDPConfig()
    cfg.gradient_dtype = dtype
    cfg.bucket_size_mb = 0.001       # several buckets, each narrowed, reduced and widened in the graph
    ddp = D.DistributedDataParallel(build(0, hidden=64, extra=True), cfg)
    step = D.TrainStep(ddp, LOSS, cx.AdamOptimizer(0.01), cuda_graphs=graphs)
    for epoch in range(2):
        step.reset()
        for i in range(0, len(Xr), 16):
            step(Xr[i:i + 16], yr[i:i + 16])
    result[name] = dict(graphed=step.graphed, replays=step.replays, loss=step.loss(), params=copies(ddp.parameters()))
    del step, ddp
g, e, f = result["graphed"], result["eager"], result["float32"]
expect(g["graphed"] and g["replays"] == 2 * 8 - 1, f"graphed: {g['graphed']}, {g['replays']} replays")
expect(not e["graphed"] and e["replays"] == 0, f"eager: {e['graphed']}, {e['replays']} replays")
check_params(f"{wire}: graphed vs eager steps", g["params"], e["params"], rtol=1e-5, atol=1e-6)
close(f"{wire}: graphed vs eager loss", g["loss"], e["loss"], rtol=1e-5)
expect(any(not np.array_equal(p, q) for p, q in zip(e["params"], f["params"])),
       f"{wire} exchange trained bit-identically to float32: was {wire} used at all?")
finish(digest=digest(g["params"]))
'''


@requires_two_gpus
@pytest.mark.parametrize("wire", ["bfloat16", "float16"])
def test_graphed_step_on_two_nccl_ranks_exchanges_16_bit_gradients(ranks, wire):
    results = ranks.run(GRAPHED, 2, env={"TEST_WIRE": wire, "DISTRIBUTED_BACKEND": "nccl", "CYXWIZ_LOG_LEVEL": "info"},
                        timeout=120)
    reports = ddp_reports(ranks, results, 2)
    assert_same_digest(reports)
    for r in results:
        assert "CUDA graph: captured the training step" in r.err, r.err[-3000:]
        assert f"in {wire} overlapped with backward" in r.err, r.err[-3000:]
