"""Many all-reduces of awkward sizes back to back: a step that waits on its own segments (the merged
last reduce-scatter / first all-gather step) must never wait for a peer that waits for it."""

import json
import re

STRESS = """
import json, numpy as np, pycyxwiz as cx
cx.distributed.init()
r, n = cx.distributed.get_rank(), cx.distributed.get_world_size()
rng = np.random.default_rng(1234)          # the same sizes on every rank
bad = 0
for i in range(ITERS):
    count = int(rng.integers(16385, 600000))
    x = np.full(count, r + 1, np.float32)
    x[::97] = r                                  # a pattern the sum must keep
    cx.distributed.all_reduce(x)
    want = np.full(count, n * (n + 1) / 2, np.float32)
    want[::97] = n * (n - 1) / 2
    bad += int(not np.array_equal(x, want))
print(json.dumps({"bad": bad}))
cx.distributed.finalize()
"""


def test_awkward_sizes_back_to_back_never_stall(ranks):
    # Small slices and segments make many steps whose last segment is shorter than a grain.
    res = ranks.run(STRESS.replace("ITERS", "2000"), 2, timeout=110,
                    env={"CYXWIZ_RING_SLICE_BYTES": "200000", "DISTRIBUTED_TIMEOUT_MS": "10000"})
    assert all(r.rc == 0 for r in res), ranks.report(res)
    assert [json.loads(r.out.strip().splitlines()[-1]) for r in res] == [{"bad": 0}] * 2


def test_awkward_sizes_three_ranks(ranks):
    res = ranks.run(STRESS.replace("ITERS", "150"), 3, timeout=110,
                    env={"CYXWIZ_RING_SLICE_BYTES": "300000", "DISTRIBUTED_TIMEOUT_MS": "10000"})
    assert all(r.rc == 0 for r in res), ranks.report(res)
    assert [json.loads(r.out.strip().splitlines()[-1]) for r in res] == [{"bad": 0}] * 3


SMALL_EIGHT = """
import hashlib, json, numpy as np, pycyxwiz as cx
cx.distributed.init()
r, n = cx.distributed.get_rank(), cx.distributed.get_world_size()
out = []
for count in (1, 7, 1000, 16384):                 # 16384 float32 = 64 KiB: the largest recursive-doubling size
    for op, name in ((cx.distributed.ReduceOp.SUM, "sum"), (cx.distributed.ReduceOp.MAX, "max"),
                     (cx.distributed.ReduceOp.AVG, "avg")):
        x = np.random.default_rng([count, r]).standard_normal(count).astype(np.float32)
        cx.distributed.all_reduce(x, op=op)
        inputs = np.stack([np.random.default_rng([count, k]).standard_normal(count).astype(np.float32)
                           for k in range(n)]).astype(np.float64)
        want = {"sum": inputs.sum(0), "max": inputs.max(0), "avg": inputs.mean(0)}[name]
        ok = bool(np.allclose(x, want, rtol=1e-5, atol=1e-5))
        out.append([count, name, ok, hashlib.sha256(x.tobytes()).hexdigest()])
print(json.dumps(out))
cx.distributed.finalize()
"""


def test_eight_ranks_small_messages_take_recursive_doubling_and_agree(ranks):
    # Eight ranks (a power of two) open butterfly links; small all-reduces combine in log2(8) rounds.
    # At debug level the backend names the algorithm the first time it takes each one: every rank
    # must have taken recursive doubling, first for the first size, and never another algorithm.
    # Over TCP: on one host the ranks would otherwise share memory (test_shm.py covers that path).
    res = ranks.run(SMALL_EIGHT, 8, timeout=110, env={"CYXWIZ_LOG_LEVEL": "debug", "CYXWIZ_TRANSPORT": "tcp"})
    assert all(r.rc == 0 for r in res), ranks.report(res)
    outs = [json.loads(r.out.strip().splitlines()[-1]) for r in res]
    assert all(ok for rank_out in outs for _, _, ok, _ in rank_out), outs[0]
    assert all(o == outs[0] for o in outs), "ranks ended with different bits"
    for r in res:
        taken = re.findall(r"DEBUG: all_reduce: (.*) \(logged at the first use", r.err)
        assert taken == ["recursive doubling for 1 float32 over 8 ranks"], f"rank {r.rank}: {taken}\n{r.err}"
