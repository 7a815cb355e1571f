"""DistributedDataParallel between real processes on 127.0.0.1, checked against one process.

The oracle is the same model (same cx.manual_seed) trained in a single process on the whole global
batch: CrossEntropyLoss.backward gives d(mean)/d(output), so the mean gradient of each rank's shard,
averaged over equal shards, is the full-batch mean gradient, and N ranks must end where one process
ends (up to float32 rounding). Every rank computes that oracle itself, checks its own parameters
against it and prints one "RESULT {json}" line; the test also compares the ranks' parameter digests,
which must be bit-identical. Data come from numpy seeded by the step number, so every rank can
rebuild any other rank's shard.

The failure cases (a different architecture on one rank, a dead peer) must end every process well
inside the harness timeout: a hang is a failure.
"""

from __future__ import annotations

import json
import re

import pytest

import pycyxwiz as cx

D = cx.distributed

PRELUDE = r'''
import hashlib, json, os, sys, time
import numpy as np
import pycyxwiz as cx

D = cx.distributed
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
errors = []
LOSS = cx.CrossEntropyLoss()


def expect(cond, message):
    if not cond:
        errors.append(str(message))


def close(name, got, want, rtol=1e-5, atol=1e-6):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        errors.append(f"{name}: shape {got.shape}, expected {want.shape}")
        return
    bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        errors.append(f"{name}: {int(bad.sum())} of {bad.size} elements differ (rtol={rtol}, atol={atol}); "
                      f"first at flat index {i}: got {got.flat[i]!r}, expected {want.flat[i]!r}; "
                      f"max abs diff {np.abs(got - want).max():.3g}")


def build(seed=0, hidden=16, act="relu", extra=False):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(20, hidden))
    m.add(cx.ReLUModule() if act == "relu" else cx.TanhModule())
    m.add(cx.LinearModule(hidden, 5))
    if extra:
        m.add(cx.LinearModule(5, 5))
    return m


def batch(step, n):
    """The global batch of a step: n rows, the same on every rank."""
    rng = np.random.default_rng([1234, step])
    X = rng.standard_normal((n, 20)).astype(np.float32)
    y = rng.integers(0, 5, n).astype(np.int64)
    return X, y


def shard(a, per_rank, rank=None):
    r = RANK if rank is None else rank
    return a[r * per_rank:(r + 1) * per_rank]


def make_opt(kind):
    if kind == "sgd":
        return cx.SGDOptimizer(0.1, momentum=0.9)
    if kind == "adam":
        return cx.AdamOptimizer(0.01)
    raise ValueError(kind)


def oracle(kind, steps, n, **build_kw):
    """One process, the whole global batch of n rows each step."""
    m = build(0, **build_kw)
    opt = make_opt(kind)
    for step in range(steps):
        X, y = batch(step, n)
        out = m.forward(X)
        m.zero_grad()
        m.backward(LOSS.backward(out, y))
        opt.step(m)
    return [np.array(p, copy=True) for p in m.parameters()]


def copies(arrays):
    return [np.array(a, copy=True) for a in arrays]


def flat(arrays):
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def digest(arrays):
    return hashlib.sha256(flat(arrays).tobytes()).hexdigest()[:32]


def check_params(name, got, want, **tol):
    expect(len(got) == len(want), f"{name}: {len(got)} parameters, expected {len(want)}")
    for i, (p, q) in enumerate(zip(got, want)):
        close(f"{name} parameter {i}", p, q, **tol)


def finish(**kw):
    print("RESULT " + json.dumps({"rank": RANK, "errors": errors, **kw}), flush=True)
    D.finalize()
'''


def reports_of(ranks, results, world_size):
    """Every rank exited 0 and printed its RESULT without errors; returns the reports in rank order."""
    assert len(results) == world_size
    assert all(r.rc == 0 for r in results), ranks.report(results)[-6000:]
    reports = []
    for r in results:
        lines = [l for l in r.out.splitlines() if l.startswith("RESULT ")]
        assert lines, ranks.report(results)[-6000:]
        rep = json.loads(lines[-1][len("RESULT "):])
        assert rep["rank"] == r.rank
        reports.append(rep)
    problems = [f"rank {rep['rank']}: {e}" for rep in reports for e in rep["errors"]]
    assert not problems, "\n".join(problems[:30]) + f"\n({len(problems)} problems)"
    return reports


def records(result, tag):
    return [json.loads(l[len(tag) + 1:]) for l in result.out.splitlines() if l.startswith(tag + " ")]


def assert_same_digest(reports, key="digest"):
    digests = {rep["rank"]: rep[key] for rep in reports}
    assert len(set(digests.values())) == 1, f"ranks ended with different bits: {digests}"


# --- configuration --------------------------------------------------------------------------------

def test_ddp_config_defaults(monkeypatch):
    monkeypatch.delenv("CYXWIZ_DDP_CHECK_GRADIENTS", raising=False)
    c = D.DDPConfig()
    assert c.broadcast_parameters is True
    assert c.bucket_size_mb == 25.0
    assert c.find_unused_parameters is False
    assert c.check_gradients is False
    c.broadcast_parameters = False
    c.bucket_size_mb = 0.5
    c.check_gradients = True
    assert (c.broadcast_parameters, c.bucket_size_mb, c.check_gradients) == (False, 0.5, True)


# --- N ranks end where one process ends -----------------------------------------------------------

EQUIVALENCE = PRELUDE + r'''
kind = os.environ["TEST_OPT"]
STEPS, N = 4, 64
B = N // WS
D.init()
model = build(0)
cfg = D.DDPConfig()
if os.environ.get("TEST_BUCKET_MB"):
    cfg.bucket_size_mb = float(os.environ["TEST_BUCKET_MB"])
ddp = D.DistributedDataParallel(model, cfg)
opt = make_opt(kind)
expect(ddp.get_world_size() == WS and ddp.get_rank() == RANK and ddp.is_master() == (RANK == 0), "rank/world info")
for step in range(STEPS):
    X, y = batch(step, N)
    xs, ys = shard(X, B), shard(y, B)
    out = ddp.forward(xs)
    ret = ddp.backward(LOSS.backward(out, ys))
    expect(ret is None, f"backward without input_grad returned {type(ret).__name__}")
    ddp.update_parameters(opt)
    grads = ddp.gradients()
    expect(len(grads) == 4 and all(not np.any(g) for g in grads),
           f"step {step}: gradients not zeroed by update_parameters")
want = oracle(kind, STEPS, N)
check_params(f"{WS} ranks x {B} rows vs 1 process x {N} rows ({kind})", ddp.parameters(), want)
for i, (p, q) in enumerate(zip(model.parameters(), ddp.parameters())):
    expect(np.array_equal(p, q), f"model.parameters()[{i}] is not ddp.parameters()[{i}]")
gathered = D.all_gather(flat(ddp.parameters()))
expect(all(np.array_equal(g, gathered[0]) for g in gathered), "all_gather: parameters differ across ranks")
finish(digest=digest(ddp.parameters()))
'''


# overlap: CYXWIZ_DDP_OVERLAP ("" = the machine's policy: on with a spare core per rank, else off).
# Both paths run everywhere: bucket all-reduces during backward on the communication thread ("1"),
# and all of them at sync time on the caller's thread ("0").
@pytest.mark.parametrize("world_size,kind,bucket_mb,overlap", [
    (1, "sgd", None, ""), (2, "sgd", None, ""), (4, "sgd", None, ""),
    (1, "adam", None, ""), (2, "adam", None, ""), (4, "adam", None, ""),
    (2, "adam", "0.0001", "1"),   # ~100-byte buckets: several all-reduces per step
    (4, "sgd", "0.0001", "1"),
    (4, "adam", None, "1"),
    (2, "adam", "0.0001", "0"),
    (4, "sgd", None, "0"),
    (2, "sgd", "100", ""),        # one big bucket
])
def test_equivalence_with_single_process(ranks, world_size, kind, bucket_mb, overlap):
    """world 1 x 64 rows, 2 x 32, 4 x 16 (rank r takes rows r*B..): same parameters as 1 x 64."""
    env = {"TEST_OPT": kind, "CYXWIZ_DDP_OVERLAP": overlap or "<unset>"}
    if bucket_mb:
        env["TEST_BUCKET_MB"] = bucket_mb
    results = ranks.run(EQUIVALENCE, world_size, env=env, timeout=45)
    reports = reports_of(ranks, results, world_size)
    assert_same_digest(reports)


# --- construction: rank 0's parameters --------------------------------------------------------------

BROADCAST = PRELUDE + r'''
D.init()
own = copies(build(RANK).parameters())        # what this rank starts from
rank0 = copies(build(0).parameters())         # what rank 0 starts from
if RANK:
    expect(any(not np.array_equal(a, b) for a, b in zip(own, rank0)), "precondition: seeds gave the same model")

model = build(RANK)
ddp = D.DistributedDataParallel(model)        # broadcast_parameters defaults to True
for name, ps in (("ddp.parameters()", ddp.parameters()), ("model.parameters()", model.parameters()),
                 ("ddp.get_model().parameters()", ddp.get_model().parameters())):
    expect(len(ps) == 4, f"{name}: {len(ps)} arrays")
    for i, (p, q) in enumerate(zip(ps, rank0)):
        expect(np.array_equal(p, q), f"broadcast_parameters=True: {name}[{i}] is not rank 0's")

cfg = D.DDPConfig()
cfg.broadcast_parameters = False
model2 = build(RANK)
ddp2 = D.DistributedDataParallel(model2, cfg)
for name, ps in (("ddp.parameters()", ddp2.parameters()), ("model.parameters()", model2.parameters())):
    for i, (p, q) in enumerate(zip(ps, own)):
        expect(np.array_equal(p, q), f"broadcast_parameters=False: {name}[{i}] is not this rank's own")
expect(ddp.get_rank() == RANK and ddp.get_world_size() == WS and ddp.is_master() == (RANK == 0),
       f"info: rank {ddp.get_rank()} world {ddp.get_world_size()} master {ddp.is_master()}")
expect(ddp.get_model().num_parameters() == model.num_parameters(), "get_model() is another model")
finish(digest=digest(ddp.parameters()), own=digest(ddp2.parameters()))
'''


def test_broadcast_parameters_on_construction(ranks):
    results = ranks.run(BROADCAST, 3, timeout=30)
    reports = reports_of(ranks, results, 3)
    assert_same_digest(reports)
    assert len({rep["own"] for rep in reports}) == 3, "broadcast_parameters=False still made the ranks equal"


# --- every rank ends bit-identical ----------------------------------------------------------------

IDENTICAL = PRELUDE + r'''
D.init()
rng = np.random.default_rng(99)
X_all = rng.standard_normal((100, 20)).astype(np.float32)
y_all = rng.integers(0, 5, 100).astype(np.int64)
model = build(0)
cfg = D.DDPConfig()
cfg.bucket_size_mb = 0.0001
ddp = D.DistributedDataParallel(model, cfg)
opt = cx.AdamOptimizer(0.01)
sampler = D.DistributedSampler(100, shuffle=True, seed=5)
it = D.DistributedBatchIterator(sampler, 8)
steps = 0
for epoch in range(2):
    sampler.set_epoch(epoch)
    while it.has_next():
        idx = it.next()
        out = ddp(X_all[idx])
        ddp.backward(LOSS.backward(out, y_all[idx]))
        ddp.update_parameters(opt)
        steps += 1
gathered = D.all_gather(flat(ddp.parameters()))
expect(all(np.array_equal(g, gathered[0]) for g in gathered), "all_gather: parameters differ across ranks")
moved = any(not np.array_equal(p, q) for p, q in zip(ddp.parameters(), build(0).parameters()))
expect(moved, "training did not change the parameters")
finish(digest=digest(ddp.parameters()), steps=steps, first=[int(i) for i in sampler.get_indices()[:5]])
'''


def test_ranks_end_bit_identical(ranks):
    """3 ranks, different shuffled shards, tiny buckets, Adam: every rank must hold the same bits."""
    results = ranks.run(IDENTICAL, 3, timeout=45)
    reports = reports_of(ranks, results, 3)
    assert len({tuple(rep["first"]) for rep in reports}) == 3, "precondition: the ranks saw the same data"
    assert {rep["steps"] for rep in reports} == {2 * 5}  # 34 samples per rank, batches of 8
    assert_same_digest(reports)


# --- gradient accumulation and no_sync ------------------------------------------------------------

ACCUMULATION = PRELUDE + r'''
mode, kind = os.environ["TEST_MODE"], os.environ["TEST_OPT"]
ACC, MB, STEPS = 4, 16, 2
PER_RANK = ACC * MB
N = PER_RANK * WS
D.init()
model = build(0)
ddp = D.DistributedDataParallel(model)
expect(ddp.shard_optimizer == (os.environ.get("CYXWIZ_DDP_SHARD_OPTIMIZER") == "1"), "ddp.shard_optimizer")
opt = make_opt(kind)
shadow = build(0)          # a plain model with this rank's data: the local gradient sums of step 0
shadow.zero_grad()


def micro(xb, yb):
    out = ddp.forward(xb)
    ddp.backward(LOSS.backward(out, yb) / ACC)


for step in range(STEPS):
    X, y = batch(step, N)
    Xr, yr = shard(X, PER_RANK), shard(y, PER_RANK)
    for i in range(ACC):
        xb, yb = Xr[i * MB:(i + 1) * MB], yr[i * MB:(i + 1) * MB]
        if mode == "no_sync" and i < ACC - 1:
            with ddp.no_sync():
                micro(xb, yb)
            if step == 0:
                # inside no_sync nothing is averaged: the gradients are this rank's own sum so far
                s_out = shadow.forward(xb)
                shadow.backward(LOSS.backward(s_out, yb) / ACC)
                for j, (g, s) in enumerate(zip(ddp.gradients(), shadow.gradients())):
                    close(f"no_sync micro-batch {i}: gradient {j} vs this rank's local sum", g, s, atol=1e-7)
        else:
            micro(xb, yb)
        if (i + 1) % ACC == 0:
            ddp.sync_gradients()
            ddp.update_parameters(opt)
want = oracle(kind, STEPS, N)
check_params(f"{mode}: {WS} ranks x {ACC} micro-batches of {MB} vs 1 process x {N} rows ({kind})",
             ddp.parameters(), want)
finish(digest=digest(ddp.parameters()))
'''


@pytest.mark.parametrize("mode,kind,overlap,shard", [
    *[(m, k, o, "0") for m in ("guide", "no_sync") for k in ("sgd", "adam") for o in ("1", "0")],
    ("guide", "adam", "1", "1"), ("no_sync", "adam", "0", "1"),   # the sharded optimizer step
])
def test_gradient_accumulation_equals_one_large_batch(ranks, mode, kind, overlap, shard):
    """The guide's loop (every backward synced, loss / accumulation_steps), and no_sync() for the
    first 3 of 4 micro-batches: both must equal one step on the 4x larger batch."""
    env = {"TEST_MODE": mode, "TEST_OPT": kind, "CYXWIZ_DDP_OVERLAP": overlap, "CYXWIZ_DDP_SHARD_OPTIMIZER": shard}
    results = ranks.run(ACCUMULATION, 2, env=env, timeout=45)
    reports = reports_of(ranks, results, 2)
    assert_same_digest(reports)


# --- sync_gradients returns the averaged gradients ------------------------------------------------

SYNC = PRELUDE + r'''
D.init()
B = 16
model = build(0)
ddp = D.DistributedDataParallel(model)
expect(ddp.shard_optimizer == (os.environ.get("CYXWIZ_DDP_SHARD_OPTIMIZER") == "1"), "ddp.shard_optimizer")
shadow = build(0)
shadow.zero_grad()
X, y = batch(0, B * WS)
xs, ys = shard(X, B), shard(y, B)
out = ddp(xs)
close("ddp(x) vs the plain model", out, shadow.forward(xs), rtol=1e-6, atol=0)
g_out = LOSS.backward(out, ys)
g_in = ddp.backward(g_out, input_grad=True)
s_in = shadow.backward(g_out, input_grad=True)
expect(g_in is not None, "backward(input_grad=True) returned None")
if g_in is not None:
    close("input gradient (local, never averaged)", g_in, s_in, atol=1e-7)
local = copies(shadow.gradients())
gathered = D.all_gather(flat(local))
want = np.mean(np.stack([np.asarray(g, np.float64) for g in gathered]), axis=0)
expect(WS == 1 or not np.allclose(flat(local), want), "precondition: the ranks' local gradients are equal")
synced = ddp.sync_gradients()
expect(isinstance(synced, list) and len(synced) == len(local), f"sync_gradients returned {type(synced).__name__}")
expect([tuple(np.shape(g)) for g in synced] == [g.shape for g in local],
       f"sync_gradients shapes {[np.shape(g) for g in synced]}, parameters {[g.shape for g in local]}")
scale = float(np.abs(want).max())
close("sync_gradients() vs numpy mean of the ranks' local gradients", flat(synced), want, atol=1e-6 * scale)
first = copies(synced)
again = ddp.sync_gradients()
expect(all(np.array_equal(a, b) for a, b in zip(first, again)), "a second sync_gradients() changed the gradients")
for name, gs in (("ddp.gradients()", ddp.gradients()), ("model.gradients()", model.gradients())):
    expect(all(np.array_equal(a, b) for a, b in zip(first, gs)), f"{name} is not what sync_gradients returned")
opt = cx.SGDOptimizer(0.5)
before = copies(ddp.parameters())
ddp.update_parameters(opt)
for i, (p, b, g) in enumerate(zip(ddp.parameters(), before, first)):
    close(f"update_parameters with SGD(0.5): parameter {i}", p, b - 0.5 * g, rtol=1e-6, atol=1e-7)
expect(all(not np.any(g) for g in ddp.gradients()), "gradients not zeroed by update_parameters")
finish(digest=digest(first))
'''


@pytest.mark.parametrize("world_size,shard", [(2, "0"), (3, "0"), (2, "1"), (3, "1")])
def test_sync_gradients_returns_the_average(ranks, world_size, shard):
    """shard "1": the sharded step reduce-scatters; sync_gradients must still return whole averages."""
    results = ranks.run(SYNC, world_size, env={"CYXWIZ_DDP_SHARD_OPTIMIZER": shard, "CYXWIZ_DDP_OVERLAP": "1"},
                        timeout=30)
    reports = reports_of(ranks, results, world_size)
    assert_same_digest(reports)


# --- buckets --------------------------------------------------------------------------------------

BUCKETS = PRELUDE + r'''
D.init()


def big():
    cx.manual_seed(0)
    m = cx.SequentialModel()
    for _ in range(6):
        m.add(cx.LinearModule(256, 256))
    return m


out = {}
for name, make, mb in (("small_default", build, None), ("small_tiny", build, 0.0001), ("small_1k", build, 0.001),
                       ("big_default", big, None)):
    m = make()
    cfg = D.DDPConfig()
    if mb is not None:
        cfg.bucket_size_mb = mb
    ddp = D.DistributedDataParallel(m, cfg)
    layers = [[int(p.nbytes) for p in m[i].parameters()] for i in range(len(m))]
    out[name] = {"mb": cfg.bucket_size_mb, "buckets": [list(map(int, b)) for b in ddp.bucket_sizes()],
                 "param_bytes": [int(p.nbytes) for p in m.parameters()], "num_parameters": m.num_parameters(),
                 "layers": [layer for layer in layers if layer]}
finish(out=out)
'''

MIB = 1 << 20


def check_buckets(name, info):
    """Buckets cut the layers, last first: a layer's parameters share one bucket (they are ready
    together); a bucket stays within its cap (the first: min(cap, 1 MiB)) unless it is one layer."""
    buckets, pbytes = info["buckets"], info["param_bytes"]
    assert buckets, f"{name}: no buckets"
    assert all(len(b) == 2 and b[0] > 0 and b[1] > 0 for b in buckets), f"{name}: {buckets}"
    sizes = [b[1] for b in buckets]
    assert sum(sizes) == 4 * info["num_parameters"] == sum(pbytes), f"{name}: bytes {sizes} for {pbytes}"
    assert sum(b[0] for b in buckets) == len(pbytes), f"{name}: counts {buckets} vs {len(pbytes)} parameters"
    layers = list(reversed(info["layers"]))
    pos = 0
    for k, (count, size) in enumerate(buckets):
        members, taken = [], 0
        while taken < count:
            assert pos < len(layers), f"{name}: bucket {k} runs past the last layer: {buckets}"
            members.append(layers[pos])
            taken += len(layers[pos])
            pos += 1
        assert taken == count, f"{name}: bucket {k} splits a layer's parameters: {buckets}, layers {info['layers']}"
        assert size == sum(map(sum, members)), f"{name}: bucket {k} holds {size} bytes, its layers {members}"
        cap = info["mb"] * MIB if k else min(info["mb"] * MIB, MIB)
        assert size <= cap or len(members) == 1, f"{name}: bucket {k} ({size} bytes) exceeds {cap:.0f}: {buckets}"
        if k + 1 < len(buckets):
            nxt = sum(layers[pos])  # the bucket closed because the next layer would not fit
            assert size + nxt > cap, f"{name}: bucket {k} closed early ({size} + {nxt} <= {cap:.0f}): {buckets}"
    assert pos == len(layers), f"{name}: buckets {buckets} do not cover the layers {info['layers']}"


def test_bucket_sizes(ranks):
    results = ranks.run(BUCKETS, 2, timeout=30)
    reports = reports_of(ranks, results, 2)
    out = reports[0]["out"]
    assert reports[1]["out"] == out, "the ranks disagree about the buckets"
    for name, info in out.items():
        check_buckets(name, info)
    assert len(out["small_default"]["buckets"]) == 1, out["small_default"]
    assert len(out["small_tiny"]["buckets"]) >= 2, f"0.0001 MiB buckets: {out['small_tiny']}"
    assert len(out["small_tiny"]["buckets"]) >= len(out["small_1k"]["buckets"]) >= 1
    # 6 x 256x256 layers (1.58 MB): the first bucket stops near 1 MiB, the rest fits in one 25 MiB bucket
    assert len(out["big_default"]["buckets"]) == 2, f"6 x Linear(256, 256), default config: {out['big_default']}"


# --- a different model on one rank ----------------------------------------------------------------

MISMATCH = PRELUDE + r'''
variant = json.loads(os.environ["TEST_VARIANT"])
D.init()
model = build(0, **(variant if RANK == 1 else {}))
t0 = time.monotonic()
try:
    ddp = D.DistributedDataParallel(model)
except Exception as e:  # noqa: BLE001 - reported to the test
    print("RAISED " + json.dumps({"cls": type(e).__name__, "msg": str(e), "elapsed": time.monotonic() - t0,
                                  "dist": isinstance(e, D.DistError)}), flush=True)
    sys.exit(3)
print("CONSTRUCTED", flush=True)
# construction let it through: one training step, so that the test still ends (and fails) quickly
try:
    X, y = batch(0, 32)
    out = ddp.forward(shard(X, 16))
    ddp.backward(LOSS.backward(out, shard(y, 16)))
    ddp.update_parameters(cx.SGDOptimizer(0.1))
    print("TRAINED", flush=True)
except Exception as e:  # noqa: BLE001
    print("STEP_RAISED " + json.dumps({"cls": type(e).__name__, "msg": str(e)}), flush=True)
sys.exit(0)
'''


@pytest.mark.parametrize("variant", [{"hidden": 17}, {"extra": True}, {"act": "tanh"}],
                         ids=["width", "depth", "activation"])
def test_different_architecture_on_one_rank_raises_everywhere(ranks, variant):
    results = ranks.run(MISMATCH, 2, env={"TEST_VARIANT": json.dumps(variant)}, timeout=30)
    text = ranks.report(results)[-6000:]
    assert all(r.rc is not None for r in results), "a rank hung:\n" + text
    for r in results:
        raised = records(r, "RAISED")
        assert raised and r.rc == 3, f"rank {r.rank}: DistributedDataParallel did not raise for {variant}:\n{text}"
        msg = raised[0]["msg"]
        assert re.search(r"architecture|mismatch|differ", msg, re.I), f"rank {r.rank}: unclear error {msg!r}"
        assert raised[0]["elapsed"] < 10, f"rank {r.rank}: took {raised[0]['elapsed']:.1f} s to notice"


# --- check_gradients --------------------------------------------------------------------------------

CHECK = PRELUDE + r'''
mode, tamper = os.environ["TEST_MODE"], os.environ["TEST_TAMPER"] == "1"
D.init()
model = build(0)
if mode == "config":
    cfg = D.DDPConfig()
    cfg.check_gradients = True
    ddp = D.DistributedDataParallel(model, cfg)
else:  # "env": CYXWIZ_DDP_CHECK_GRADIENTS=1 in the environment; "off": nothing
    ddp = D.DistributedDataParallel(model)
opt = cx.SGDOptimizer(0.1)
for step in range(3):
    X, y = batch(step, 16 * WS)
    out = ddp.forward(shard(X, 16))
    ddp.backward(LOSS.backward(out, shard(y, 16)))
    ddp.sync_gradients()
    if tamper and RANK == 1 and step == 1:
        ddp.gradients()[0] *= 2
    ddp.update_parameters(opt)
    sys.stderr.flush()
finish(digest=digest(ddp.parameters()))
'''


@pytest.mark.parametrize("mode,tamper,warns", [
    ("config", True, True),
    ("env", True, True),
    ("config", False, False),
    ("off", True, False),
])
def test_check_gradients_warns_when_ranks_differ(ranks, monkeypatch, mode, tamper, warns):
    monkeypatch.delenv("CYXWIZ_DDP_CHECK_GRADIENTS", raising=False)
    env = {"TEST_MODE": mode, "TEST_TAMPER": "1" if tamper else "0"}
    if mode == "env":
        env["CYXWIZ_DDP_CHECK_GRADIENTS"] = "1"
    results = ranks.run(CHECK, 2, env=env, timeout=30)
    reports = reports_of(ranks, results, 2)
    lines = [l for r in results for l in r.err.splitlines() if "Gradients differ across ranks" in l]
    if warns:
        assert lines, f"{mode}: no 'Gradients differ across ranks' warning:\n" + ranks.report(results)[-4000:]
        assert any("0.weight" in l for l in lines), f"the warning does not name parameter 0.weight: {lines}"
        assert len({rep["digest"] for rep in reports}) == 2, "precondition: the tampered rank did not diverge"
    else:
        assert not lines, f"{mode}, tamper={tamper}: unexpected warning: {lines}"
        if not tamper:
            assert_same_digest(reports)


# --- a dead peer ----------------------------------------------------------------------------------

DEAD_PEER = PRELUDE + r'''
where = os.environ["TEST_WHERE"]
DEAD = WS - 1
D.init()
model = build(0)
ddp = D.DistributedDataParallel(model)
opt = cx.SGDOptimizer(0.1)
t0 = time.monotonic()  # steps take milliseconds: the time since the loop began bounds the detection time
step = 0
try:
    for step in range(50):
        if step == 3 and RANK == DEAD and where == "before_step":
            os._exit(1)
        X, y = batch(step, 16 * WS)
        out = ddp.forward(shard(X, 16))
        ddp.backward(LOSS.backward(out, shard(y, 16)))
        if step == 3 and RANK == DEAD and where == "after_backward":
            os._exit(1)
        ddp.update_parameters(opt)
    print("FINISHED", flush=True)
except Exception as e:  # noqa: BLE001 - reported to the test
    print("RAISED " + json.dumps({"cls": type(e).__name__, "msg": str(e), "step": step,
                                  "elapsed": time.monotonic() - t0,
                                  "dist": isinstance(e, D.DistError)}), flush=True)
    sys.exit(3)
'''


@pytest.mark.parametrize("where", ["before_step", "after_backward"])
def test_dead_peer_raises_dist_error(ranks, where):
    results = ranks.run(DEAD_PEER, 3, env={"TEST_WHERE": where, "DISTRIBUTED_TIMEOUT_MS": "10000"}, timeout=40)
    text = ranks.report(results)[-6000:]
    assert all(r.rc is not None for r in results), "a rank hung:\n" + text
    assert results[2].rc == 1, text
    for r in results[:2]:
        raised = records(r, "RAISED")
        assert raised and r.rc == 3, f"rank {r.rank}: no exception after its peer died:\n{text}"
        rec = raised[0]
        assert rec["dist"], f"rank {r.rank}: {rec['cls']} is not a DistError: {rec['msg']}"
        # A rank leaves a collective as soon as it has what it needs, so the dead rank may start step 3
        # while a survivor is still finishing step 2's all-reduce: the job monitor then stops that
        # survivor at step 2. after_backward: the dead rank's all-reduce of step 3 may have completed
        # during its backward; then the survivors see it gone at step 4.
        allowed = (2, 3) if where == "before_step" else (2, 3, 4)
        assert rec["step"] in allowed, f"rank {r.rank}: the error came at step {rec['step']}, the peer died at step 3"
        assert rec["elapsed"] is not None and rec["elapsed"] < 15, f"rank {r.rank}: {rec}"


# --- optimizer.step(model) on a wrapped model -------------------------------------------------------

DIRECT_STEP = PRELUDE + r'''
D.init()
model = build(0)
ddp = D.DistributedDataParallel(model)
opt = make_opt("sgd")
refused = []
for step in range(3):
    X, y = batch(step, 16 * WS)
    out = ddp.forward(shard(X, 16))
    ddp.backward(LOSS.backward(out, shard(y, 16)))
    try:
        opt.step(model)            # not ddp.update_parameters: must never step on unaveraged gradients
        model.zero_grad()
    except ValueError as e:
        refused.append(str(e))
        ddp.update_parameters(opt)
expect(ddp.overlap == (os.environ["CYXWIZ_DDP_OVERLAP"] == "1"), f"overlap is {ddp.overlap}")
check_params("optimizer.step(model) after ddp.backward", ddp.parameters(), oracle("sgd", 3, 16 * WS))
finish(refused=refused, digest=digest(ddp.parameters()))
'''


@pytest.mark.parametrize("overlap", ["1", "0"])
def test_optimizer_step_on_the_wrapped_model_never_uses_unaveraged_gradients(ranks, overlap):
    """With overlap, optimizer.step(model) waits for the in-flight all-reduces (as torch's backward
    does) and gives update_parameters' result; without, the gradients are still local after backward
    and the step is refused with an error that names the remedy."""
    results = ranks.run(DIRECT_STEP, 2, env={"CYXWIZ_DDP_OVERLAP": overlap}, timeout=30)
    reports = reports_of(ranks, results, 2)
    assert_same_digest(reports)
    for rep in reports:
        if overlap == "1":
            assert rep["refused"] == [], rep["refused"]
        else:
            assert len(rep["refused"]) == 3, rep
            assert all("update_parameters" in m and "not averaged" in m for m in rep["refused"]), rep["refused"]
