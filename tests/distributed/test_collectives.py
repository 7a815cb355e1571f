"""cx.distributed collectives between real processes on 127.0.0.1, checked against numpy.

Every rank builds its inputs from a seeded RNG (seed = rank and the case), so every rank can
recompute every other rank's input and check a result against numpy's reduction of all of them.
Each world runs many cases and prints one JSON line; the test compares ranks with each other (the
bytes of every all_reduce result must be identical on every rank) and collects the oracle's
complaints. Integer results must equal numpy's exactly; float SUM/AVG/PRODUCT may be summed in
another order than numpy's, so they must lie within a rounding-error bound of the exact result
(computed in long double); MAX/MIN must be exact, NaN included.
"""

from __future__ import annotations

import json

import pytest

# Shared by every rank script: the inputs, the oracle, and the JSON report.
PRELUDE = r'''
import hashlib, json, os, pickle, sys, time
import numpy as np
import pycyxwiz as cx

dist = cx.distributed
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
DTYPES = ["float32", "float64", "int32", "int64"]
OPS = ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]
errors = []
report = {"rank": RANK, "errors": errors, "checks": 0}
# MAX/MIN with a NaN on one rank: the CPU backend lets it win (numpy.maximum). NCCL's float MAX/MIN are
# fmaxf/fminf, where the other operand wins; a script for GPU tensors under NCCL sets this False.
NAN_WINS = True


def expect(cond, message):
    report["checks"] += 1
    if not cond:
        errors.append(str(message))


def expect_raises(exc_type, fn, *args, contains=(), **kwargs):
    """fn(*args) must raise exc_type whose message contains every string of `contains`."""
    report["checks"] += 1
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        missing = [c for c in contains if c not in str(e)]
        if missing:
            errors.append(f"{fn.__name__}{args!r:.60}: {type(e).__name__} {str(e)!r} lacks {missing}")
        return e
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        errors.append(f"{fn.__name__}{args!r:.60}: expected {exc_type.__name__}, got {type(e).__name__}: {e}")
        return e
    errors.append(f"{fn.__name__}{args!r:.60}: expected {exc_type.__name__}, nothing was raised")
    return None


def make(rank, dtype, count, op="SUM", tag=0):
    """Rank `rank`'s input for a case: a pure function of its arguments, so any rank can rebuild it."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng([rank, count, DTYPES.index(dtype), OPS.index(op), tag])
    if dt.kind == "f":
        if op == "PRODUCT":
            x = rng.uniform(0.5, 1.5, count) * rng.choice([-1.0, 1.0], count)
        else:
            x = rng.standard_normal(count) * 100.0
    elif op == "PRODUCT":
        x = rng.integers(1, 4, count) * rng.choice([-1, 1], count)
    elif dt == np.int64:
        x = rng.integers(-2**40, 2**40, count)  # sums that need more than 32 bits
    else:
        x = rng.integers(-10**6, 10**6, count)
    x = x.astype(dt)
    if op in ("MAX", "MIN") and count:
        idx = np.arange(count)
        if dt.kind == "f":
            x[idx % 11 == rank + 1] = np.nan          # a NaN from one rank only (see NAN_WINS)
            x[idx % 13 == rank] = np.inf if rank % 2 else -np.inf
        else:
            info = np.iinfo(dt)
            x[idx % 13 == rank] = info.max if rank % 2 else info.min
    return x


def truncated_quotient(a, n):
    """AVG of integers as torch and NCCL define it: the (wrapped) sum over n, truncated toward zero."""
    return (np.sign(a) * (np.abs(a.astype(np.int64)) // n)).astype(a.dtype)


def oracle_check(name, got, inputs, op, dtype):
    """Compare `got` (any shape) with numpy's reduction of `inputs` (one array per rank)."""
    dt = np.dtype(dtype)
    n = len(inputs)
    s = np.stack([np.asarray(a).ravel() for a in inputs])
    got = np.asarray(got)
    report["checks"] += 1
    if got.dtype != dt:
        errors.append(f"{name}: dtype {got.dtype}, expected {dt}")
        return
    g = got.ravel()
    if g.shape != s.shape[1:]:
        errors.append(f"{name}: {g.size} elements, expected {s.shape[1]}")
        return
    if op in ("MAX", "MIN"):
        if NAN_WINS:
            ref = (np.maximum if op == "MAX" else np.minimum).reduce(s, axis=0)
        else:
            ref = (np.fmax if op == "MAX" else np.fmin).reduce(s, axis=0)
        bad = ~((g == ref) | (np.isnan(g) & np.isnan(ref)) if dt.kind == "f" else (g == ref))
    elif dt.kind == "i":
        ref = s.prod(axis=0, dtype=dt) if op == "PRODUCT" else s.sum(axis=0, dtype=dt)
        if op == "AVG":
            ref = truncated_quotient(ref, n)
        bad = g != ref
    else:
        L = s.astype(np.longdouble)
        eps = np.longdouble(np.finfo(dt).eps)
        if op in ("SUM", "AVG"):
            ref = L.sum(axis=0)
            bound = 2 * n * eps * np.abs(L).sum(axis=0)
            if op == "AVG":
                ref = ref / n
                bound = bound / n + 2 * eps * np.abs(ref)
        else:
            ref = L.prod(axis=0)
            bound = 2 * n * eps * np.abs(ref)
        bad = ~(np.abs(g.astype(np.longdouble) - ref) <= bound)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        errors.append(f"{name}: {int(np.count_nonzero(bad))} of {g.size} elements wrong; first at {i}: "
                      f"got {g[i]!r}, numpy says {ref[i]!r} (inputs {s[:, i].tolist()!r})")


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:24]


def done():
    dist.finalize()
    print(json.dumps(report))
'''


def outputs(ranks, results, world_size):
    """Every rank exited 0 and printed its report; returns the reports in rank order."""
    assert len(results) == world_size
    assert all(r.rc == 0 for r in results), ranks.report(results)
    reports = []
    for r in results:
        lines = r.out.strip().splitlines()
        assert lines, ranks.report(results)
        rep = json.loads(lines[-1])
        assert rep["rank"] == r.rank
        reports.append(rep)
    problems = [f"rank {rep['rank']}: {e}" for rep in reports for e in rep["errors"]]
    assert not problems, "\n".join(problems[:40]) + f"\n({len(problems)} problems)\n" + ranks.report(results)[-4000:]
    return reports


def all_reduce_counts(world_size: int) -> list[int]:
    """Element counts on both sides of every size threshold."""
    big = 3 * 2**20 // 4 + 1  # 3 MiB + 4 B of float32: several 1 MiB slices
    return sorted({0, 1, 7, world_size - 1, 4 * world_size + 1, 16385, big})


ALL_REDUCE = PRELUDE + r'''
COUNTS = json.loads(os.environ["TEST_COUNTS"])
dist.init()
expect(dist.get_world_size() == WS and dist.get_rank() == RANK, "rank/world size")
expect(dist.get_config().transport == os.environ["TEST_TRANSPORT"], f"transport: {dist.get_config().transport}")
digests = {}
case = 0
for dtype in DTYPES:
    itemsize = np.dtype(dtype).itemsize
    counts = list(COUNTS)
    if WS > 1:
        # the last count of the gather-then-reduce path and the first of the ring path for this dtype
        last_small = 65536 // ((WS - 1) * itemsize)
        counts += [last_small, last_small + 1]
        # shared memory: the last one-round size, and one chunk (a half-slot of 256 KiB) and a bit
        counts += [32768 // itemsize, 32768 // itemsize + 1, 262144 // itemsize, 262144 // itemsize + 1]
    for op in OPS:
        for count in counts:
            name = f"all_reduce {op} {dtype} x{count}"
            x = make(RANK, dtype, count, op)
            ret = dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            expect(ret is None, f"{name}: returned {ret!r} instead of None")
            digests[name] = digest(x)
            if case % WS == RANK:  # the oracle's work is shared out; the digests tie every rank to it
                oracle_check(name, x, [make(r, dtype, count, op) for r in range(WS)], op, dtype)
            case += 1
report["digests"] = digests
done()
'''


# On one host "auto" takes shared memory: tcp keeps the ring's algorithms under test too, and
# shm-ring runs the same ring algorithms through shared memory (CYXWIZ_SHM_ALGORITHM=ring).
TRANSPORTS = [pytest.param(w, t, id=f"{w}-{t}") for w in (1, 2, 3, 4) for t in ("shm", "tcp", "shm-ring")
              if w > 1 or t == "tcp"]


def transport_env(transport: str) -> dict:
    """The variables that select `transport`, and what get_config().transport must then say."""
    if transport == "shm-ring":
        return {"CYXWIZ_TRANSPORT": "shm", "CYXWIZ_SHM_ALGORITHM": "ring", "TEST_TRANSPORT": "shm"}
    return {"CYXWIZ_TRANSPORT": transport, "TEST_TRANSPORT": transport}


@pytest.mark.parametrize("world_size, transport", TRANSPORTS)
def test_all_reduce_every_op_dtype_and_size(ranks, world_size, transport):
    counts = all_reduce_counts(world_size)
    results = ranks.run(ALL_REDUCE, world_size, env={"TEST_COUNTS": json.dumps(counts), **transport_env(transport)})
    reports = outputs(ranks, results, world_size)
    digests = [rep["digests"] for rep in reports]
    # 20 op/dtype pairs, each at every count (+ the two threshold counts).
    per_pair = len(counts) + (6 if world_size > 1 else 0)
    assert len(digests[0]) >= 20 * (per_pair - 2), sorted(digests[0])
    assert sum(rep["checks"] for rep in reports) >= len(digests[0])
    for rep in reports[1:]:
        differing = [k for k in digests[0] if rep["digests"].get(k) != digests[0][k]]
        assert not differing and rep["digests"].keys() == digests[0].keys(), (
            f"rank {rep['rank']} ended with other bits than rank 0: {differing[:10]}")


SMALL_SLICES = PRELUDE + r'''
dist.init()
digests = {}
case = 0
for dtype in DTYPES:
    for op in ["SUM", "AVG", "MAX", "PRODUCT"]:
        for count in [16385, 100003]:
            name = f"all_reduce {op} {dtype} x{count}"
            x = make(RANK, dtype, count, op, tag=1)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            digests[name] = digest(x)
            if case % WS == RANK:
                oracle_check(name, x, [make(r, dtype, count, op, tag=1) for r in range(WS)], op, dtype)
            case += 1
report["digests"] = digests
done()
'''


AVG_BITS = PRELUDE + r'''
dist.init()
rng = np.random.default_rng(5)
for dtype in ("float32", "float64"):
    info = np.finfo(dtype)
    # Subnormals, ordinary values and values near the top, on every rank the same magnitudes.
    scale = np.array([info.smallest_subnormal * 7, 1.0, info.max / 8], dtype)[rng.integers(0, 3, 50001)]
    xs = [(np.random.default_rng([r, 5]).standard_normal(50001) * scale).astype(dtype) for r in range(WS)]
    x = xs[RANK].copy()
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    total = xs[0].copy()
    for r in range(1, WS):
        total = total + xs[r]  # rank order: shared memory reduces so, and 2 ranks have one order
    want = total / np.asarray(WS, dtype)
    expect(np.array_equal(x.view(np.uint8), want.view(np.uint8)), f"AVG {dtype}: not bit for bit the sum divided by {WS}")
    # A shared buffer larger than a window's half (DDP's buckets), read where it lies: the same bits.
    big = [np.tile(v, 7)[:300001] for v in xs]
    shared = dist._shared_zeros(big[RANK])
    shared[:] = big[RANK]
    dist.all_reduce(shared, op=dist.ReduceOp.AVG)
    total = big[0].copy()
    for r in range(1, WS):
        total = total + big[r]
    want = total / np.asarray(WS, dtype)
    expect(np.array_equal(shared.view(np.uint8), want.view(np.uint8)),
           f"AVG {dtype}, shared buffer: not bit for bit the sum divided by {WS}")
    del shared
    # SUM in rank order, to the bit: fewer elements than ranks (the small path), a window's chunks, a
    # shared buffer.
    for n in (1, 2, 50001, 300001):
        ys = [np.tile(v, 7)[:n] for v in xs]
        y = dist._shared_zeros(ys[RANK]) if n == 300001 else ys[RANK].copy()
        y[:] = ys[RANK]
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        total = ys[0].copy()
        for r in range(1, WS):
            total = total + ys[r]
        expect(np.array_equal(y.view(np.uint8), total.view(np.uint8)), f"SUM {dtype} of {n}: not the rank-order sum")
        del y
done()
'''


@pytest.mark.parametrize("world_size, transport", [(2, "shm"), (2, "tcp"), (3, "shm"), (4, "shm")])
def test_average_is_the_divided_sum_to_the_bit(ranks, world_size, transport):
    """AVG over 2, 3 or 4 ranks: the same bits as numpy dividing the rank-order sum (by a power of two
    the engine multiplies by 1/N, by 3 it divides), subnormal and huge values included; SUM is the
    rank-order sum, from 1 element to a shared buffer (2 ranks on either transport, 3 and 4 on shared
    memory, where every rank sums its part from all sources in one pass)."""
    outputs(ranks, ranks.run(AVG_BITS, world_size, env={"CYXWIZ_TRANSPORT": transport}), world_size)


def test_all_reduce_in_many_small_ring_slices(ranks):
    """CYXWIZ_RING_SLICE_BYTES=4096: dozens of slices per call, a partial slice at the end."""
    results = ranks.run(SMALL_SLICES, 3, env={"CYXWIZ_RING_SLICE_BYTES": "4096"})
    reports = outputs(ranks, results, 3)
    assert len(reports[0]["digests"]) == 16 * 2
    for rep in reports[1:]:
        assert rep["digests"] == reports[0]["digests"], f"rank {rep['rank']} differs from rank 0"


OTHER_COLLECTIVES = PRELUDE + r'''
dist.init()
expect(dist.get_config().transport == os.environ["TEST_TRANSPORT"], f"transport: {dist.get_config().transport}")
BIG = 3 * 2**20 // 4 + 1

# broadcast: from every source, every dtype, sizes around the thresholds, several shapes.
for src in range(WS):
    for dtype in DTYPES:
        shapes = [(0,), (1,), (7,), (16385,), (3, 4, 5), (2, 0, 3)]
        if dtype in ("float32", "int64"):
            shapes.append((BIG,))
        for shape in shapes:
            count = int(np.prod(shape))
            x = make(RANK, dtype, count, tag=10 + src).reshape(shape)
            ret = dist.broadcast(x, src=src)
            want = make(src, dtype, count, tag=10 + src).reshape(shape)
            expect(ret is None, f"broadcast returned {ret!r}")
            expect(x.shape == shape and x.dtype == np.dtype(dtype), f"broadcast {shape}: became {x.shape} {x.dtype}")
            expect(np.array_equal(x, want), f"broadcast src={src} {dtype} {shape}: not rank {src}'s array")

# all_gather: a list of every rank's array, in rank order, each shaped like the input.
for dtype in DTYPES:
    for shape in [(0,), (1,), (7,), (WS + 2, 3), (2, 3, 4), (16385,)]:
        count = int(np.prod(shape))
        x = make(RANK, dtype, count, tag=20).reshape(shape)
        before = x.copy()
        got = dist.all_gather(x)
        name = f"all_gather {dtype} {shape}"
        expect(isinstance(got, list) and len(got) == WS, f"{name}: got {type(got).__name__} of {len(got)}")
        for r, part in enumerate(got):
            want = make(r, dtype, count, tag=20).reshape(shape)
            expect(isinstance(part, np.ndarray) and part.shape == shape and part.dtype == np.dtype(dtype),
                   f"{name}: part {r} is {getattr(part, 'shape', part)} {getattr(part, 'dtype', '')}")
            expect(np.array_equal(part, want), f"{name}: part {r} is not rank {r}'s array")
        expect(np.array_equal(x, before), f"{name}: the input changed")

# all_gather accepts inputs it only reads: a strided view, a read-only array.
base = make(RANK, "float64", 40, tag=21)
got = dist.all_gather(base[::3])
expect(all(np.array_equal(got[r], make(r, "float64", 40, tag=21)[::3]) for r in range(WS)), "all_gather of a strided view")
ro = make(RANK, "int32", 9, tag=22)
ro.setflags(write=False)
got = dist.all_gather(ro)
expect(all(np.array_equal(got[r], make(r, "int32", 9, tag=22)) for r in range(WS)), "all_gather of a read-only array")

# reduce_scatter: numpy.array_split(reduced.ravel(), WS)[RANK], for counts not divisible by WS.
for dtype in DTYPES:
    for op in OPS:
        for shape in [(0,), (1,), (max(WS - 1, 1),), (4 * WS + 1,), (16385,), (5, 7)]:
            count = int(np.prod(shape))
            x = make(RANK, dtype, count, op, tag=30).reshape(shape)
            before = x.copy()
            part = dist.reduce_scatter(x, op=getattr(dist.ReduceOp, op))
            name = f"reduce_scatter {op} {dtype} {shape}"
            inputs = [make(r, dtype, count, op, tag=30) for r in range(WS)]
            sizes = [len(p) for p in np.array_split(np.arange(count), WS)]
            expect(isinstance(part, np.ndarray) and part.ndim == 1 and part.shape == (sizes[RANK],),
                   f"{name}: part shaped {getattr(part, 'shape', part)}, expected ({sizes[RANK]},)")
            lo = sum(sizes[:RANK])
            oracle_check(name, part, [a[lo:lo + sizes[RANK]] for a in inputs], op, dtype)
            expect(np.array_equal(x, before, equal_nan=True), f"{name}: the input changed")

# reduce_scatter of a strided view (an input only).
base = make(RANK, "float32", 61, tag=31)
part = dist.reduce_scatter(base[1::2])
inputs = [make(r, "float32", 61, tag=31)[1::2] for r in range(WS)]
oracle_check("reduce_scatter strided", part, [np.array_split(a, WS)[RANK] for a in inputs], "SUM", "float32")

# all_reduce keeps the shape of multi-dimensional arrays.
for dtype in DTYPES:
    for shape in [(3, 4, 5), (2, 0, 3), (1, 1), (64, 300)]:
        count = int(np.prod(shape))
        x = make(RANK, dtype, count, "MAX", tag=40).reshape(shape)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        expect(x.shape == shape, f"all_reduce {shape}: became {x.shape}")
        oracle_check(f"all_reduce MAX {dtype} {shape}", x, [make(r, dtype, count, "MAX", tag=40) for r in range(WS)], "MAX", dtype)
        x = make(RANK, dtype, count, tag=41).reshape(shape)
        dist.all_reduce(x)
        oracle_check(f"all_reduce SUM {dtype} {shape}", x, [make(r, dtype, count, tag=41) for r in range(WS)], "SUM", dtype)

# barrier: nobody leaves before the last one has arrived (the arrival order changes each round).
times = []
for k in range(3):
    time.sleep(0.15 * ((RANK + k) % WS))
    enter = time.time()
    ret = dist.barrier()
    times.append([enter, time.time()])
    expect(ret is None, f"barrier returned {ret!r}")
w = dist.barrier(async_op=True)
expect(w.wait() is True and w.is_completed() and w.is_success(), "async barrier")
report["barrier"] = times
done()
'''


@pytest.mark.parametrize("world_size, transport", TRANSPORTS)
def test_broadcast_all_gather_reduce_scatter_barrier(ranks, world_size, transport):
    results = ranks.run(OTHER_COLLECTIVES, world_size, env=transport_env(transport))
    reports = outputs(ranks, results, world_size)
    assert all(rep["checks"] > 300 for rep in reports), [rep["checks"] for rep in reports]
    for k in range(3):
        last_in = max(rep["barrier"][k][0] for rep in reports)
        first_out = min(rep["barrier"][k][1] for rep in reports)
        assert first_out >= last_in, f"barrier round {k}: a rank left at {first_out} before the last arrived at {last_in}"


ASYNC = PRELUDE + r'''
dist.init()
BIG = 3 * 2**20 // 4 + 1
cases = [("float32", BIG, "SUM"), ("int64", 13, "MAX"), ("float64", 16385, "AVG"), ("int32", 1, "PRODUCT"),
         ("float32", 0, "MIN"), ("float64", 7, "SUM")]
arrays = [make(RANK, dt, n, op, tag=50) for dt, n, op in cases]
works = [dist.all_reduce(a, op=getattr(dist.ReduceOp, op), async_op=True) for a, (dt, n, op) in zip(arrays, cases)]
gx = make(RANK, "int32", 10, tag=51).reshape(2, 5)
w_gather = dist.all_gather(gx, async_op=True)
rx = make(RANK, "float64", 4 * WS + 3, tag=52)
w_rs = dist.reduce_scatter(rx, op=dist.ReduceOp.MAX, async_op=True)
bx = make(RANK, "int64", 1000, tag=53)
w_bc = dist.broadcast(bx, src=WS - 1, async_op=True)
w_bar = dist.barrier(async_op=True)
expect(all(isinstance(w, dist.Work) for w in works + [w_gather, w_rs, w_bc, w_bar]), "async_op=True returns Work")

# Waited in reverse order: the later ones cannot finish before the earlier ones anyway.
for w in [w_bar, w_bc, w_rs, w_gather] + works[::-1]:
    expect(w.wait() is True, f"{w!r}: wait() is not True")
    expect(w.is_completed() and w.is_success(), f"{w!r}: not completed/successful after wait")
for a, (dt, n, op) in zip(arrays, cases):
    oracle_check(f"async all_reduce {op} {dt} x{n}", a, [make(r, dt, n, op, tag=50) for r in range(WS)], op, dt)
expect(works[0].result() is None, "all_reduce's Work.result() is None")
parts = w_gather.result()
expect(len(parts) == WS and all(np.array_equal(p, make(r, "int32", 10, tag=51).reshape(2, 5)) for r, p in enumerate(parts)),
       "async all_gather result()")
rin = [np.array_split(make(r, "float64", 4 * WS + 3, tag=52), WS)[RANK] for r in range(WS)]
oracle_check("async reduce_scatter MAX", w_rs.result(), rin, "MAX", "float64")
expect(np.array_equal(bx, make(WS - 1, "int64", 1000, tag=53)), "async broadcast")

# Issue order: a blocking call after an async one on the same array sees its result, and finds it done.
x = np.full(5, RANK + 1, dtype=np.int64)
w = dist.all_reduce(x, async_op=True)
dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
total = WS * (WS + 1) // 2
expect(w.is_completed(), "async work issued before a blocking call is completed when the blocking call returns")
expect(np.array_equal(x, np.full(5, total ** WS)), f"issue order: got {x}, expected {total ** WS}")

# wait(timeout) while a peer is late: DistTimeoutError (a TimeoutError), the work keeps running.
dist.barrier()
y = np.full(3, float(RANK), dtype=np.float32)
if RANK == 0 and WS > 1:
    w = dist.all_reduce(y, async_op=True)
    t0 = time.monotonic()
    e = expect_raises(dist.DistTimeoutError, w.wait, timeout=0.3)
    waited = time.monotonic() - t0
    expect(isinstance(e, TimeoutError), "DistTimeoutError is a TimeoutError")
    expect(0.25 <= waited < 2.5, f"wait(timeout=0.3) returned after {waited:.2f} s")
    expect(not w.is_completed(), "is_completed() while a peer has not called yet")
    expect(w.wait(timeout=30) is True and w.is_success(), "the work completes once the peers arrive")
else:
    time.sleep(3.0)
    dist.all_reduce(y)
expect(np.array_equal(y, np.full(3, float(sum(range(WS))), dtype=np.float32)), f"late all_reduce: {y}")
done()
'''


def test_async_work(ranks):
    results = ranks.run(ASYNC, 3)
    reports = outputs(ranks, results, 3)
    assert reports[0]["checks"] >= 30


ERRORS = PRELUDE + r'''
dist.init()
ops = [dist.all_reduce, dist.broadcast]
for fn in [dist.all_reduce, dist.broadcast, dist.all_gather, dist.reduce_scatter]:
    for dtype in ["uint16", "uint32", "complex64", "uint64"]:  # float16, int8, uint8, int16, bool: see test_collective_dtypes
        expect_raises(TypeError, fn, np.zeros(4, dtype=dtype), contains=[fn.__name__, str(np.dtype(dtype))])
    for bad in [[1.0, 2.0], 3.0, None, "abc", (1, 2)]:
        expect_raises(TypeError, fn, bad, contains=[fn.__name__, "numpy array"])

for fn in ops:
    base = np.arange(12, dtype=np.float32)
    expect_raises(ValueError, fn, base[::2], contains=["C-contiguous"])
    f = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    expect_raises(ValueError, fn, f, contains=["C-contiguous"])
    ro = np.arange(6, dtype=np.int64)
    ro.setflags(write=False)
    expect_raises(ValueError, fn, ro, contains=["read-only"])
    expect(np.array_equal(ro, np.arange(6)) and np.array_equal(base, np.arange(12)), f"{fn.__name__}: input changed by a refused call")

x = np.array([True, False, True, False, True])
expect_raises(ValueError, dist.all_reduce, x, op=dist.ReduceOp.AVG,
              contains=[f"[rank {RANK}/{WS}] all_reduce: ReduceOp.AVG", "bool", "MAX"])
expect_raises(ValueError, dist.reduce_scatter, x, op=dist.ReduceOp.AVG,
              contains=[f"[rank {RANK}/{WS}] reduce_scatter: ReduceOp.AVG", "bool"])
expect(np.array_equal(x, [True, False, True, False, True]), "refused AVG changed the array")
expect_raises(ValueError, dist.all_reduce, x, op=dist.ReduceOp.AVG, async_op=True, contains=["AVG"])

for src in [-1, WS, WS + 5]:
    expect_raises(ValueError, dist.broadcast, np.zeros(3, np.float32), src=src, contains=["src"])

# None of the refused calls reached the wire: the job still works, in step.
x = make(RANK, "float64", 100, tag=60)
dist.all_reduce(x)
oracle_check("all_reduce after refused calls", x, [make(r, "float64", 100, tag=60) for r in range(WS)], "SUM", "float64")

# Ranks that disagree on a collective: DistBackendError, and the group stays broken.
y = np.zeros(10 + RANK, dtype=np.float32)
e = expect_raises(dist.DistBackendError, dist.all_reduce, y, contains=["mismatch", f"[rank {RANK}/{WS}]"])
expect_raises(dist.DistError, dist.all_reduce, np.zeros(3, np.float32))
done()
'''


def test_argument_errors_and_mismatch(ranks):
    results = ranks.run(ERRORS, 2)
    reports = outputs(ranks, results, 2)
    assert all(rep["checks"] >= 54 for rep in reports), [rep["checks"] for rep in reports]


EQUIVALENT_DTYPES = PRELUDE + r'''
dist.init()
# Arrays whose dtype equals float32/int64 but is another numpy dtype object: an unpickled array
# (multiprocessing, DataLoader workers) and numpy.longlong (int64 on Linux). They must be accepted.
for name, arr in [("unpickled float32", pickle.loads(pickle.dumps(np.arange(4, dtype=np.float32)))),
                  ("unpickled int32", pickle.loads(pickle.dumps(np.arange(4, dtype=np.int32)))),
                  ("longlong", np.arange(4, dtype=np.longlong)),
                  ("dtype('<f8')", np.arange(4, dtype=np.dtype("<f8")))]:
    want = arr * WS
    for fn in [dist.all_reduce, dist.all_gather, dist.broadcast, dist.reduce_scatter]:
        try:
            out = fn(arr.copy())
            report["checks"] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(f"{fn.__name__}({name} array, dtype {arr.dtype}): {type(e).__name__}: {e}")
    y = arr.copy()
    try:
        dist.all_reduce(y)
        expect(np.array_equal(y, want), f"all_reduce({name}): {y}")
    except Exception as e:  # noqa: BLE001
        errors.append(f"all_reduce({name}): {type(e).__name__}: {e}")
done()
'''


def test_dtypes_equal_to_supported_ones_are_accepted(ranks):
    results = ranks.run(EQUIVALENT_DTYPES, 2)
    outputs(ranks, results, 2)


BEFORE_INIT = PRELUDE + r'''
expect(dist.is_initialized() is False, "is_initialized() before init")
calls = [(dist.get_rank, ()), (dist.get_world_size, ()), (dist.get_local_rank, ()), (dist.is_master, ()),
         (dist.get_config, ()), (dist.get_backend, ()), (dist.all_reduce, (np.ones(3, np.float32),)),
         (dist.broadcast, (np.ones(3, np.float32),)), (dist.all_gather, (np.ones(3, np.float32),)),
         (dist.reduce_scatter, (np.ones(3, np.float32),)), (dist.barrier, ())]
for fn, args in calls:
    expect_raises(dist.DistError, fn, *args, contains=["not initialized", "init()"])
dist.finalize()  # finalize before init: a no-op
expect(dist.is_initialized() is False, "is_initialized() after finalize without init")
print(json.dumps(report))
'''


def test_calls_before_init_raise_dist_error(ranks):
    results = ranks.run(BEFORE_INIT, 2)
    reports = outputs(ranks, results, 2)
    assert all(rep["checks"] == 13 for rep in reports)


REINIT = PRELUDE + r'''
dist.init()
expect(dist.is_initialized(), "is_initialized() after init")
expect_raises(dist.DistError, dist.init, contains=["already initialized"])
x = make(RANK, "float32", 1000, tag=70)
dist.all_reduce(x)
oracle_check("first generation", x, [make(r, "float32", 1000, tag=70) for r in range(WS)], "SUM", "float32")
if RANK == 0:
    time.sleep(float(os.environ["TEST_RANK0_LINGER"]))  # rank 0 leaves late: its peers come back first
dist.finalize()
dist.finalize()  # idempotent
expect(not dist.is_initialized(), "is_initialized() after finalize")
expect_raises(dist.DistError, dist.get_rank, contains=["not initialized"])
expect_raises(dist.DistError, dist.all_reduce, np.ones(3, np.float32), contains=["not initialized"])
dist.init()
expect(dist.get_rank() == RANK and dist.get_world_size() == WS, "rank/world size after re-init")
for tag in (71, 72):
    x = make(RANK, "float64", 20000, tag=tag)
    dist.all_reduce(x)
    oracle_check(f"second generation {tag}", x, [make(r, "float64", 20000, tag=tag) for r in range(WS)], "SUM", "float64")
done()
'''


@pytest.mark.parametrize("rank0_linger", [0.0, 1.0])
def test_init_finalize_init_again(ranks, rank0_linger):
    # rank0_linger=1: rank 1 finalizes and calls init() again while rank 0 still serves the first
    # rendezvous; it must end up in the second job all the same. (6 s: ample for two ranks.)
    results = ranks.run(REINIT, 2, env={"TEST_RANK0_LINGER": rank0_linger, "DISTRIBUTED_TIMEOUT_MS": 6000})
    reports = outputs(ranks, results, 2)
    assert all(rep["checks"] >= 9 for rep in reports)


IDENTITY = PRELUDE + r'''
dist.init()
cfg = dist.get_config()
report["info"] = dict(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=dist.get_local_rank(),
                      is_master=dist.is_master(), backend=dist.get_backend(), source=cfg.source,
                      cfg_rank=cfg.rank, cfg_world=cfg.world_size, cfg_local=cfg.local_rank,
                      port=cfg.master_port, addr=cfg.master_addr, timeout_ms=cfg.timeout_ms)
dist.barrier()
done()
'''


def test_rank_local_rank_and_master(ranks):
    # rank 1 sits on a "second node" (LOCAL_RANK=0); ranks 0 and 2 have no LOCAL_RANK: it defaults to RANK.
    results = ranks.run(IDENTITY, 3, rank_env={1: {"LOCAL_RANK": "0"}, 2: {"LOCAL_RANK": "<unset>"}})
    reports = outputs(ranks, results, 3)
    info = {rep["rank"]: rep["info"] for rep in reports}
    for r in range(3):
        i = info[r]
        want_local = 0 if r == 1 else r
        assert (i["rank"], i["world_size"], i["local_rank"], i["is_master"]) == (r, 3, want_local, r == 0), i
        assert (i["cfg_rank"], i["cfg_world"], i["cfg_local"]) == (r, 3, want_local), i
        assert i["backend"] == "cpu" and i["source"] == "RANK/WORLD_SIZE", i
        assert i["port"] == ranks.port and i["addr"] == "127.0.0.1" and i["timeout_ms"] == 20000, i
