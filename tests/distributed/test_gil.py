"""The communication thread never needs the GIL; every binding that can wait releases it.

An async collective on a numpy array keeps the array alive until its task is done. The task ends on
the communication thread; if dropping that reference took the GIL while the main thread sat in a
binding that waits for the communication thread with the GIL held (`del ddp`, Optimizer.zero_grad),
both threads waited for each other forever, past DISTRIBUTED_TIMEOUT_MS. Each scenario here runs
between real processes with rank 1 late (so the collective is still on rank 0's communication thread
while rank 0 enters the binding); a hang is a failure (the harness kills the ranks at its deadline).
"""

from __future__ import annotations

import json

PRELUDE = r'''
import json, os, sys, time, weakref
import numpy as np
import pycyxwiz as cx

D = cx.distributed
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
D.init()


def build():
    cx.manual_seed(0)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(20, 16))
    m.add(cx.ReLUModule())
    m.add(cx.LinearModule(16, 5))
    return m
'''

# The reproduction (the array kept in `a`, to check the sum; the old owner took the GIL either way).
REPRO = PRELUDE + r'''
ddp = D.DistributedDataParallel(build())
assert ddp.overlap, "CYXWIZ_DDP_OVERLAP=1 should put the bucket all-reduces on the communication thread"
if RANK == 1:
    time.sleep(1)
a = np.ones(1 << 16, np.float32)
w = D.all_reduce(a, async_op=True)
out = ddp.forward(np.ones((8, 20), np.float32))
ddp.backward(np.ones_like(out))
start = time.monotonic()
del ddp
seconds = time.monotonic() - start
w.wait(timeout=10)
print("RESULT " + json.dumps({"del_seconds": seconds, "sum_ok": bool(np.all(a == WS))}))
D.finalize()
'''


def results_of(results):
    out = {}
    for r in results:
        lines = [line for line in r.out.splitlines() if line.startswith("RESULT ")]
        if lines:
            out[r.rank] = json.loads(lines[-1][len("RESULT "):])
    return out


def test_del_ddp_while_async_numpy_collective_in_flight(ranks):
    # DISTRIBUTED_TIMEOUT_MS=5 s: before the fix both ranks were still stuck 4x past it.
    results = ranks.run(REPRO, 2, env={"CYXWIZ_DDP_OVERLAP": "1", "DISTRIBUTED_TIMEOUT_MS": "5000"}, timeout=20)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    got = results_of(results)
    assert sorted(got) == [0, 1], ranks.report(results)
    for rank, res in got.items():
        assert res["sum_ok"], f"rank {rank}: all_reduce of ones is not world_size everywhere\n{ranks.report(results)}"
        assert res["del_seconds"] < 5, f"rank {rank}: del ddp took {res['del_seconds']:.1f} s\n{ranks.report(results)}"


# Every binding that can block (wait for the communication thread, a peer, the process group's lock
# or the disk), each run while an async all-reduce of a numpy array is on the communication thread
# and rank 1 is late. The script runs them in this order; a name missing from a rank's report is the
# one that hung.
BLOCKING_BINDINGS = [
    "Work.wait",
    "Work.result",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "barrier",
    "get_rank",  # with get_world_size, is_initialized, ...: they take the process group's lock
    "DistributedDataParallel.__init__",
    "DistributedDataParallel.forward",
    "DistributedDataParallel.backward",
    "DistributedDataParallel.sync_gradients",
    "DistributedDataParallel.update_parameters",
    "DistributedDataParallel.zero_grad",
    "SequentialModel.gradients",
    "SequentialModel.zero_grad",
    "Optimizer.zero_grad",
    "Optimizer.step",
    "del DistributedDataParallel",
    "TrainStep.__call__",
    "TrainStep.loss",
    "TrainStep.samples",
    "del TrainStep",
    "DistributedTrainer.__init__",
    "DistributedTrainer.fit",
    "DistributedTrainer.evaluate",
    "DistributedTrainer.predict",
    "DistributedTrainer.save_checkpoint",
    "DistributedTrainer.load_checkpoint",
    "del DistributedTrainer",
    "finalize",
]

WALK = PRELUDE + r'''
SLOW = 0.3      # rank 1 enters every step this late: rank 0's communication thread holds the array meanwhile
BOUND = float(os.environ["TEST_BOUND"])
LR = 0.1
LOSS = cx.CrossEntropyLoss()
Y = np.arange(8) % 5
report = {}


def data(rank):
    return np.random.default_rng([7, rank]).standard_normal((8, 20)).astype(np.float32)


X = data(RANK)


def close(a, b):
    return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6))


def oracle_grads(params):
    """The mean over ranks of each rank's gradient, from one plain model with `params`."""
    ref = build()
    for p, v in zip(ref.parameters(), params):
        p[...] = v
    total = [np.zeros_like(v) for v in params]
    for r in range(WS):
        ref.zero_grad()
        out = ref.forward(data(r))
        ref.backward(LOSS.backward(out, Y))
        total = [t + g for t, g in zip(total, ref.gradients())]
    return [t / WS for t in total]


def step(name, call, prepare=None):
    """Runs `call` while all_reduce(ones, async_op=True) is in flight; `call` returns (ok, shared) where
    `shared` must be the same on every rank."""
    if RANK == 1:
        time.sleep(SLOW)
    a = np.ones(1 << 16, np.float32)
    w = D.all_reduce(a, async_op=True)
    if prepare:
        prepare()
    start = time.monotonic()
    ok, shared = call(w)
    seconds = time.monotonic() - start
    w.wait(timeout=BOUND)
    report[name] = {"seconds": round(seconds, 3), "sum_ok": bool(np.all(a == WS)), "ok": bool(ok), "shared": shared}
    print("DONE", name, flush=True)


state = {}
model = build()
opt = cx.SGDOptimizer(LR)


def backward():
    ddp = state["ddp"]
    out = ddp.forward(X)
    ddp.backward(LOSS.backward(out, Y))


def grads_equal_oracle(got):
    want = oracle_grads([p.copy() for p in model.parameters()])
    return all(close(g, o) for g, o in zip(got, want))


def zeroed():
    return all(not np.any(g) for g in model.gradients())


def drop(key):
    state.pop(key)  # the last reference: the destructor runs inside the timed call
    return True, None


def wrapped():
    if RANK == 1:  # DDP must replace this with rank 0's parameters
        model.parameters()[0][...] += 1.0
    state["ddp"] = D.DistributedDataParallel(model)
    return close(model.parameters()[0], build().parameters()[0]), None


b4 = np.full(4, RANK + 1, np.float32)
bc = np.full(4, RANK, np.float32)
step("Work.wait", lambda w: (w.wait() is True, None))
step("Work.result", lambda w: (w.result() is None, None))
step("all_reduce", lambda w: (D.all_reduce(b4) is None and np.all(b4 == WS * (WS + 1) / 2), None))
step("broadcast", lambda w: (D.broadcast(bc, src=WS - 1) is None and np.all(bc == WS - 1), None))
step("all_gather", lambda w: (all(np.all(p == r) for r, p in enumerate(D.all_gather(np.full(3, RANK, np.int64)))), None))
step("reduce_scatter", lambda w: (close(D.reduce_scatter(np.arange(4 * WS, dtype=np.float32)),
                                        np.array_split(np.arange(4 * WS) * WS, WS)[RANK]), None))
step("barrier", lambda w: (D.barrier() is None, None))
step("get_rank", lambda w: (D.get_rank() == RANK and D.get_world_size() == WS and D.is_initialized(), None))
step("DistributedDataParallel.__init__", lambda w: wrapped())
step("DistributedDataParallel.forward", lambda w: (close(state["ddp"].forward(X), build().forward(X)), None))
step("DistributedDataParallel.backward", lambda w: (state["ddp"].backward(LOSS.backward(state["ddp"].forward(X), Y)) is None,
                                                    None), prepare=backward)
state["ddp"].zero_grad()
step("DistributedDataParallel.sync_gradients", lambda w: (grads_equal_oracle(state["ddp"].sync_gradients()), None),
     prepare=backward)
state["ddp"].zero_grad()


def updated(apply):
    before = [p.copy() for p in model.parameters()]
    g = oracle_grads(before)
    apply()
    return all(close(p, b - LR * gi) for p, b, gi in zip(model.parameters(), before, g)), None


step("DistributedDataParallel.update_parameters", lambda w: updated(lambda: state["ddp"].update_parameters(opt)),
     prepare=backward)
step("DistributedDataParallel.zero_grad", lambda w: (state["ddp"].zero_grad() is None and zeroed(), None), prepare=backward)
step("SequentialModel.gradients", lambda w: (grads_equal_oracle(model.gradients()), None), prepare=backward)
state["ddp"].zero_grad()
step("SequentialModel.zero_grad", lambda w: (model.zero_grad() is None and zeroed(), None), prepare=backward)
step("Optimizer.zero_grad", lambda w: (opt.zero_grad(model) is None and zeroed(), None), prepare=backward)
step("Optimizer.step", lambda w: updated(lambda: opt.step(model)), prepare=backward)
state["ddp"].zero_grad()
step("del DistributedDataParallel", lambda w: drop("ddp"), prepare=backward)

model = build()
state["ddp"] = D.DistributedDataParallel(model)
state["ts"] = D.TrainStep(state["ddp"], LOSS, cx.SGDOptimizer(LR))


def train_step():
    before = [p.copy() for p in model.parameters()]
    g = oracle_grads(before)
    state["ts"](X, Y)
    return all(close(p, b - LR * gi) for p, b, gi in zip(model.parameters(), before, g)), None


step("TrainStep.__call__", lambda w: train_step())
step("TrainStep.loss", lambda w: (np.isfinite(state["ts"].loss()), None))
step("TrainStep.samples", lambda w: (state["ts"].samples == len(X), None))
step("del TrainStep", lambda w: drop("ts"))
del state["ddp"]

XF = np.random.default_rng(11).standard_normal((64, 20)).astype(np.float32)
YF = np.arange(64) % 5
CKPT = os.path.join(os.getcwd(), "gil.ckpt")


def digest():
    return [float(p.sum()) for p in state["trainer"].get_model().parameters()]


def trained():
    state["trainer"] = D.DistributedTrainer(build(), LOSS, cx.SGDOptimizer(LR))
    return True, None


def fit():
    config = D.DistributedTrainingConfig()
    config.epochs, config.batch_size, config.verbose = 1, 16, False
    h = state["trainer"].fit(XF, YF, config)
    return len(h.train_losses) == 1, digest()


def saved():
    state["trainer"].save_checkpoint(CKPT)
    return (os.path.getsize(CKPT) > 0) if RANK == 0 else True, None


def loaded():
    want = digest()
    for p in state["trainer"].get_model().parameters():
        p[...] = 0.0
    state["trainer"].load_checkpoint(CKPT)
    return digest() == want, digest()


step("DistributedTrainer.__init__", lambda w: trained())
step("DistributedTrainer.fit", lambda w: fit())
step("DistributedTrainer.evaluate", lambda w: (True, list(state["trainer"].evaluate(XF, YF, batch_size=16))))
step("DistributedTrainer.predict", lambda w: (close(state["trainer"].predict(XF, batch_size=16),
                                                    state["trainer"].get_model().forward(XF)), None))
step("DistributedTrainer.save_checkpoint", lambda w: saved())
step("DistributedTrainer.load_checkpoint", lambda w: loaded())
step("del DistributedTrainer", lambda w: drop("trainer"))
step("finalize", lambda w: (D.finalize() is None and not D.is_initialized(), None))
print("RESULT " + json.dumps(report))
'''


def test_every_blocking_binding_completes_while_the_comm_thread_holds_a_numpy_array(ranks):
    bound = 10.0  # seconds per binding; a deadlock never returns, a timeout would take DISTRIBUTED_TIMEOUT_MS
    results = ranks.run(WALK, 2, env={"CYXWIZ_DDP_OVERLAP": "1", "DISTRIBUTED_TIMEOUT_MS": "15000", "TEST_BOUND": bound},
                        timeout=90)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    got = results_of(results)
    assert sorted(got) == [0, 1], ranks.report(results)
    for rank, rep in got.items():
        assert list(rep) == BLOCKING_BINDINGS, f"rank {rank} ran {list(rep)}"
        for name, res in rep.items():
            assert res["sum_ok"], f"rank {rank}, {name}: the in-flight all_reduce of ones is not world_size everywhere"
            assert res["ok"], f"rank {rank}, {name}: wrong result\n{ranks.report(results)}"
            assert res["seconds"] < bound, f"rank {rank}, {name}: took {res['seconds']} s"
    for name in BLOCKING_BINDINGS:
        assert got[0][name]["shared"] == got[1][name]["shared"], f"{name}: ranks disagree: {got[0][name]} vs {got[1][name]}"


# The communication thread cannot drop a Python reference itself: it hands it back, and the thread
# that waits for the work releases it. Nothing may leak: every array is gone once wait() returns.
RELEASED = PRELUDE + r'''
alive = 0
for i in range(20):
    if RANK == 1 and i % 4 == 0:
        time.sleep(0.1)                    # sometimes the work is still running when wait() starts
    a = np.full(1 << 14, i, np.float32)
    r = weakref.ref(a)
    w = D.all_reduce(a, async_op=True)
    del a                                  # the communication thread holds the only reference
    w.wait(timeout=10)
    alive += r() is not None
b = np.ones(8, np.float32)
r = weakref.ref(b)
w = D.all_reduce(b, async_op=True)
del b
while not w.is_completed():
    time.sleep(0.01)
D.barrier()                                # any blocking call releases what was handed back
print("RESULT " + json.dumps({"alive_after_wait": alive, "alive_after_barrier": r() is not None}))
D.finalize()
'''


def test_arrays_held_by_the_comm_thread_are_released_after_wait(ranks):
    results = ranks.run(RELEASED, 2, timeout=60)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    got = results_of(results)
    assert sorted(got) == [0, 1], ranks.report(results)
    for rank, res in got.items():
        assert res == {"alive_after_wait": 0, "alive_after_barrier": False}, f"rank {rank}: {res}"


# init() holds the process group's lock through the rendezvous, and its Ctrl-C check takes the GIL:
# a thread asking is_initialized() (a progress reporter, a watchdog) must wait for that lock without
# the GIL, or neither thread moves again.
INIT_WHILE_POLLED = r'''
import json, os, threading, time
import numpy as np
import pycyxwiz as cx

D = cx.distributed
RANK = int(os.environ["RANK"])
seen = []


def poll():
    while True:
        seen.append(time.monotonic())
        if D.is_initialized():
            return


t = threading.Thread(target=poll, daemon=True)
t.start()
while not seen:
    time.sleep(0.001)
if RANK == 1:
    time.sleep(1)   # rank 0 waits in the rendezvous meanwhile
start = time.monotonic()
D.init()
t.join(timeout=10)
a = np.ones(4, np.float32)
D.all_reduce(a)
print("RESULT " + json.dumps({"init_seconds": time.monotonic() - start, "poller_done": not t.is_alive(),
                              "polls": len(seen), "sum_ok": bool(np.all(a == 2))}))
D.finalize()
'''


def test_init_while_another_thread_asks_is_initialized(ranks):
    results = ranks.run(INIT_WHILE_POLLED, 2, env={"DISTRIBUTED_TIMEOUT_MS": "5000"}, timeout=30)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    got = results_of(results)
    assert sorted(got) == [0, 1], ranks.report(results)
    for rank, res in got.items():
        assert res["poller_done"] and res["sum_ok"], f"rank {rank}: {res}"
        assert res["init_seconds"] < 5, f"rank {rank}: init took {res['init_seconds']:.1f} s"
