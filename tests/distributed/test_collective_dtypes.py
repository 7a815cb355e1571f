"""The 16-bit and byte dtypes of the collectives: float16, bfloat16, int8, uint8, int16, bool.

The conversions behind float16/bfloat16 reductions are checked against numpy (float16) and torch
(bfloat16) over every 16-bit pattern, the rounding ties between neighbours and random float32
bits. The collectives run between real processes, on cx.distributed and on a _Group (bfloat16 as
int16 bits with dtype="bfloat16"), against numpy: integers exactly (wrap-around included), bool
exactly (SUM/MAX = any, PRODUCT/MIN = all), float16 at 2 ranks bit for bit as numpy's own float16
arithmetic (a float32 operation rounded back), at 3 ranks within the rounding of each ring hop.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import free_port
from test_collectives import PRELUDE as BASE_PRELUDE
from test_collectives import outputs

import pycyxwiz as cx

# ------------------------------------------------------------------ conversions (one process)


def _float32_cases() -> np.ndarray:
    """Random float32 bits, every float16 value, and the ties between neighbours with their float32
    neighbours (round-to-nearest-even decides exactly there), zeros, infinities and NaNs."""
    rng = np.random.default_rng(15)
    random_bits = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    ordered = np.unique(halves[np.isfinite(halves)])
    ties = ((ordered[:-1].astype(np.float64) + ordered[1:]) / 2).astype(np.float32)  # exact in float32
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65519.99, 65520, 65536, 2.0**-24,
                      2.0**-25, 2.0**-26, 3 * 2.0**-26, 2.0**-14, np.finfo(np.float32).max,
                      np.finfo(np.float32).tiny, np.finfo(np.float32).smallest_subnormal], dtype=np.float32)
    return np.concatenate([random_bits, halves, ties, near, edges, -ties])


def _same_bits(got_bits: np.ndarray, want_bits: np.ndarray, is_nan: np.ndarray, what: str) -> None:
    """Equal bits, except that a NaN only has to stay a NaN (payloads differ between libraries)."""
    bad = (got_bits != want_bits) & ~is_nan
    assert not bad.any(), f"{what}: {int(bad.sum())} values differ, first: got {got_bits[bad][:5]} want {want_bits[bad][:5]}"


def test_float16_conversions_match_numpy():
    x = _float32_cases()
    got = cx._core._round_to_16(x, "float16")
    with np.errstate(over="ignore", invalid="ignore"):  # large values become Inf, as they should
        want = x.astype(np.float16).view(np.uint16)
    is_nan = np.isnan(x)
    _same_bits(got, want, is_nan, "float32 -> float16")
    assert np.isnan(got.view(np.float16)[is_nan]).all(), "a NaN did not stay NaN"
    assert np.array_equal(np.signbit(got.view(np.float16)), np.signbit(x)), "a sign was lost"

    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    wide = cx._core._widen_16(every, "float16")
    want = every.view(np.float16).astype(np.float32)
    _same_bits(wide.view(np.uint32), want.view(np.uint32), np.isnan(want), "float16 -> float32")
    assert np.array_equal(np.isnan(wide), np.isnan(want))
    # Round trip: every float16 comes back as itself.
    back = cx._core._round_to_16(wide, "float16")
    _same_bits(back, every, np.isnan(want), "float16 -> float32 -> float16")


def test_bfloat16_conversions_match_torch():
    torch = pytest.importorskip("torch")
    x = _float32_cases()
    got = cx._core._round_to_16(x, "bfloat16")
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    is_nan = np.isnan(x)
    _same_bits(got, want, is_nan, "float32 -> bfloat16")
    widened = (got.astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(widened[is_nan]).all() and not np.isnan(widened[~is_nan]).any()

    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    wide = cx._core._widen_16(every, "bfloat16")
    want = torch.from_numpy(every.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    _same_bits(wide.view(np.uint32), want.view(np.uint32), np.isnan(want), "bfloat16 -> float32")
    assert np.array_equal(np.isnan(wide), np.isnan(want))


# ------------------------------------------------------------------ collectives between processes

PRELUDE = BASE_PRELUDE + r'''
NEW = ["float16", "bfloat16", "int8", "uint8", "int16", "bool"]
OPS = ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]
U16 = np.uint16


def make16(rank, dtype, count, op="SUM", tag=0):
    """Rank `rank`'s input; bfloat16 as its bits (uint16). A pure function of its arguments."""
    rng = np.random.default_rng([rank, count, NEW.index(dtype), OPS.index(op), tag, 15])
    idx = np.arange(count)
    if dtype in ("float16", "bfloat16"):
        if op == "PRODUCT":
            f = rng.uniform(0.5, 1.5, count) * rng.choice([-1.0, 1.0], count)
        else:
            f = rng.standard_normal(count) * 100.0
            f[idx % 17 == 3] *= 1e-7                       # float16 subnormals
        if op in ("MAX", "MIN"):
            f[idx % 11 == rank + 1] = np.nan
            f[idx % 13 == rank] = np.inf if rank % 2 else -np.inf
        f = f.astype(np.float32)
        if dtype == "float16":
            return f.astype(np.float16)
        return (f.view(np.uint32) >> 16).astype(U16)        # truncated: any bits are a valid input
    if dtype == "bool":
        return rng.random(count) < (0.3 if op in ("SUM", "MAX") else 0.8)
    info = np.iinfo(dtype)
    # The whole range: sums and products wrap around.
    return rng.integers(info.min, int(info.max) + 1, count).astype(dtype)


def widen(a, dtype):
    """As float64 values: bfloat16 bits widened exactly."""
    a = np.asarray(a)
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def check16(name, got, inputs, op, dtype):
    """`got` against numpy's reduction of `inputs` (one array per rank)."""
    s = np.stack([np.asarray(a).ravel() for a in inputs])
    got = np.asarray(got).ravel()
    n = len(inputs)
    report["checks"] += 1
    want_dtype = np.dtype(U16 if dtype == "bfloat16" else dtype)
    if got.dtype != want_dtype or got.shape != s.shape[1:]:
        errors.append(f"{name}: {got.dtype} {got.shape}, expected {want_dtype} {s.shape[1:]}")
        return
    if dtype == "bool":
        ref = s.any(axis=0) if op in ("SUM", "MAX") else s.all(axis=0)
        bad = got != ref
    elif dtype not in ("float16", "bfloat16"):
        fn = {"SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[op]
        ref = fn.reduce(s, axis=0, dtype=s.dtype)
        if op == "AVG":  # the wrapped sum over n, truncated toward zero (torch's and NCCL's AVG of integers)
            ref = (np.sign(ref) * (np.abs(ref.astype(np.int64)) // n)).astype(s.dtype)
        bad = got != ref
    elif op in ("MAX", "MIN"):
        w, g = widen(s, dtype), widen(got, dtype)
        ref = (np.maximum if op == "MAX" else np.minimum).reduce(w, axis=0)
        bad = ~((g == ref) | (np.isnan(g) & np.isnan(ref)))
    elif dtype == "float16" and n == 2:
        # One rounding step: numpy's own float16 arithmetic, a float32 operation rounded back.
        ref = s[0] * s[1] if op == "PRODUCT" else s[0] + s[1]
        if op == "AVG":
            ref = ref / np.float16(2)
        bad = ~((got == ref) | (np.isnan(got) & np.isnan(ref)))
        bad |= np.signbit(got) != np.signbit(ref)
    else:
        # Each of the n-1 hops rounds to 16 bits: half an ulp of a partial result, at most.
        eps = 2.0**-11 if dtype == "float16" else 2.0**-8
        tiny = 2.0**-24 if dtype == "float16" else 0.0
        w, g = widen(s, dtype), widen(got, dtype)
        if op == "PRODUCT":
            ref = w.prod(axis=0)
            bound = 2 * n * eps * np.abs(ref) + n * tiny
        else:
            ref = w.sum(axis=0)
            bound = 2 * n * eps * np.abs(w).sum(axis=0) + n * tiny
            if op == "AVG":
                ref = ref / n
                bound = bound / n + 2 * eps * np.abs(ref) + tiny
        bad = ~(np.abs(g - ref) <= bound)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        errors.append(f"{name}: {int(np.count_nonzero(bad))} of {got.size} wrong; first at {i}: got {got[i]!r}, "
                      f"numpy says {ref[i]!r} (inputs {s[:, i].tolist()!r})")


def make_group():
    c = dist.DistributedConfig()
    c.rank, c.world_size, c.master_addr = RANK, WS, "127.0.0.1"
    c.master_port, c.timeout_ms = int(os.environ["GROUP_PORT"]), 20000
    return dist._Group(c)


def ops_for(dtype):
    return [op for op in OPS if op != "AVG" or dtype != "bool"]
'''

COLLECTIVES = PRELUDE + r'''
COUNTS = json.loads(os.environ["TEST_COUNTS"])
dist.init()
group = make_group()
digests = {}

for dtype in NEW:
    # bfloat16 has no numpy dtype: through the _Group, as int16 bits with dtype="bfloat16".
    bf = dtype == "bfloat16"
    kw = {"dtype": "bfloat16"} if bf else {}
    api = group if bf else dist
    for op in ops_for(dtype):
        for count in COUNTS:
            name = f"all_reduce {op} {dtype} x{count}"
            x = make16(RANK, dtype, count, op)
            if bf:
                x = x.view(np.int16)  # what torch's t.view(torch.int16).numpy() gives
            api.all_reduce(x, op=getattr(dist.ReduceOp, op), **kw)
            x = x.view(U16) if bf else x
            digests[name] = digest(x)
            check16(name, x, [make16(r, dtype, count, op) for r in range(WS)], op, dtype)

    for count in [0, 1, 7, 4 * WS + 1, 70007]:
        shape = (count // 7, 7) if count > 7 and count % 7 == 0 else (count,)  # 70007: 2-D
        # broadcast: rank src's bytes, from every source.
        for src in range(WS):
            x = make16(RANK, dtype, count, tag=10 + src).reshape(shape)
            api.broadcast(x, src=src, **kw)
            want = make16(src, dtype, count, tag=10 + src).reshape(shape)
            expect(x.dtype == want.dtype and x.tobytes() == want.tobytes(), f"broadcast {dtype} x{count} from {src}")
        # all_gather: every rank's bytes in rank order.
        x = make16(RANK, dtype, count, tag=20).reshape(shape)
        want = [make16(r, dtype, count, tag=20).reshape(shape) for r in range(WS)]
        if bf:
            out = np.empty((WS,) + shape, U16)
            api.all_gather(x, out, **kw)
            parts = list(out)
        else:
            parts = dist.all_gather(x)
        expect(len(parts) == WS and all(p.dtype == w.dtype and p.shape == w.shape and p.tobytes() == w.tobytes()
                                        for p, w in zip(parts, want)), f"all_gather {dtype} x{count}")
        # reduce_scatter: this rank's numpy.array_split part of the reduction.
        for op in ops_for(dtype):
            x = make16(RANK, dtype, count, op, tag=30).reshape(shape)
            before = x.copy()
            sizes = [len(p) for p in np.array_split(np.arange(count), WS)]
            if bf:
                part = np.empty(sizes[RANK], U16)
                api.reduce_scatter(x, part, op=getattr(dist.ReduceOp, op), **kw)
            else:
                part = dist.reduce_scatter(x, op=getattr(dist.ReduceOp, op))
            lo = sum(sizes[:RANK])
            ins = [make16(r, dtype, count, op, tag=30)[lo:lo + sizes[RANK]] for r in range(WS)]
            check16(f"reduce_scatter {op} {dtype} x{count}", part, ins, op, dtype)
            expect(x.tobytes() == before.tobytes(), f"reduce_scatter {op} {dtype}: the input changed")

# The _Group takes the numpy dtypes too, in place.
for dtype in ["float16", "int8", "uint8", "int16", "bool"]:
    x = make16(RANK, dtype, 1001, "MAX", tag=40)
    group.all_reduce(x, op=dist.ReduceOp.MAX)
    check16(f"_Group all_reduce MAX {dtype}", x, [make16(r, dtype, 1001, "MAX", tag=40) for r in range(WS)], "MAX", dtype)
    out = np.empty((WS, 1001), x.dtype)
    group.all_gather(x, out)
    expect(all(out[r].tobytes() == x.tobytes() for r in range(WS)), f"_Group all_gather {dtype}")

report["digests"] = digests
group.shutdown()
done()
'''


@pytest.mark.parametrize("world_size,slice_bytes", [(2, None), (3, None), (3, 4096)],
                         ids=["2 ranks", "3 ranks", "3 ranks, 4 KiB ring slices"])
def test_every_op_and_new_dtype_against_numpy(ranks, world_size, slice_bytes):
    # Both sides of each algorithm's threshold for 1- and 2-byte elements (recursive doubling or
    # gather below 64 KiB, the ring above), counts not divisible by the world size, several slices.
    counts = [0, 1, 7, 4 * world_size + 1, 16385, 65536 // (world_size - 1) + 1, 3 * 2**20 // 2 + 1]
    env = {"TEST_COUNTS": json.dumps(counts), "GROUP_PORT": free_port()}
    if slice_bytes:
        env["CYXWIZ_RING_SLICE_BYTES"] = slice_bytes
    results = ranks.run(COLLECTIVES, world_size, env=env, timeout=240)
    reports = outputs(ranks, results, world_size)
    assert len(reports[0]["digests"]) == (5 * 5 + 4) * len(counts)  # (2 floats and 3 integers x 5 ops + bool x 4 ops) x counts
    for rep in reports[1:]:
        differing = [k for k in reports[0]["digests"] if rep["digests"].get(k) != reports[0]["digests"][k]]
        assert not differing, f"rank {rep['rank']} ended with other bits than rank 0: {differing[:10]}"
    assert all(rep["checks"] > 300 for rep in reports), [rep["checks"] for rep in reports]


ERRORS = PRELUDE + r'''
dist.init()
group = make_group()
# AVG of bool: refused before anything is sent, with the remedy.
x = make16(RANK, "bool", 5)
before = x.copy()
for fn in [dist.all_reduce, dist.reduce_scatter, group.all_reduce]:
    expect_raises(ValueError, fn, x, op=dist.ReduceOp.AVG, contains=["ReduceOp.AVG of a bool array", "ReduceOp.MAX"])
expect(np.array_equal(x, before), "a refused AVG changed the bool array")
# What stays refused, and what dtype= takes.
for dtype in ["uint16", "uint32", "uint64", "complex64", "float128"]:
    expect_raises(TypeError, dist.all_reduce, np.zeros(4, dtype), contains=["all_reduce", dtype, "is not supported"])
for bad in [np.zeros(4, np.float32), np.zeros(4, np.float16), np.zeros(4, np.int32), [1, 2]]:
    expect_raises(TypeError, group.all_reduce, bad, dtype="bfloat16", contains=["all_reduce", "bfloat16", "int16 or uint16"])
for bad in ["float16", "bf16", np.float16]:
    expect_raises(ValueError, group.broadcast, np.zeros(4, np.int16), dtype=bad, contains=["broadcast", "dtype=", "bfloat16"])

# None of that reached the wire: both communicators still work, in step.
x = np.full(6, RANK + 1, np.int8)
dist.all_reduce(x)
expect(np.array_equal(x, np.full(6, WS * (WS + 1) // 2, np.int8)), f"all_reduce after refused calls: {x}")
y = np.full(6, RANK + 1, np.int16).view(np.uint16)
y[:] = np.float32(RANK + 1).view(np.uint32) >> 16
group.all_reduce(y, dtype="bfloat16")
expect(np.array_equal((y.astype(np.uint32) << 16).view(np.float32), np.full(6, WS * (WS + 1) / 2)), f"bfloat16 sum {y}")

# Same element count and size, another dtype: the call header tells them apart.
a = np.zeros(8, np.float16 if RANK == 0 else np.int16)
e = expect_raises(dist.DistBackendError, dist.all_reduce, a, contains=["mismatch", f"[rank {RANK}/{WS}]"])
expect(e is not None and "(float16, 8" in str(e) and "(int16, 8" in str(e), f"the mismatch names both dtypes: {e}")
b = np.zeros(8, np.float16) if RANK == 0 else np.zeros(8, np.int16)
kw = {} if RANK == 0 else {"dtype": "bfloat16"}
e = expect_raises(dist.DistBackendError, group.all_reduce, b, contains=["mismatch"], **kw)
expect(e is not None and "(float16, 8" in str(e) and "(bfloat16, 8" in str(e), f"the mismatch names both dtypes: {e}")
group.shutdown()
done()
'''


def test_refused_calls_and_dtype_mismatch_between_ranks(ranks):
    results = ranks.run(ERRORS, 2, env={"GROUP_PORT": free_port()})
    reports = outputs(ranks, results, 2)
    assert all(rep["checks"] >= 20 for rep in reports), [rep["checks"] for rep in reports]
