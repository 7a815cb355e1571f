"""What the trainer and checkpoint tests share: the head of every rank script (data, model, config, a
JSON report per rank) and the helpers that run the ranks and read their reports."""

from __future__ import annotations

import json
from pathlib import Path

from harness import free_port  # also imported from here by test_torch_backend.py

# The head of every rank script. A test file appends its own lines; hist() reads the HISTORY tuple
# that the file defines (which history fields it compares).
RANK_PRELUDE = r'''
import hashlib, json, os, sys, threading, time
from pathlib import Path
import numpy as np
import pycyxwiz as cx
D = cx.distributed
HERE = Path(__file__).resolve().parent
RANK = int(os.environ.get("RANK", "0"))
FEATURES, CLASSES = 20, 4


def blobs(n, seed, spread=1.0):
    """4 well separated gaussian blobs in 20 dimensions (the same centres for every seed)."""
    centers = np.random.RandomState(1234).normal(0.0, 1.5, size=(CLASSES, FEATURES))
    rng = np.random.RandomState(seed)
    y = rng.randint(0, CLASSES, size=n)
    x = centers[y] + rng.normal(0.0, spread, size=(n, FEATURES))
    return x.astype(np.float32), y.astype(np.int64)


def build(seed=0, hidden=32, dropout=None, act=None):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    m.add(cx.LinearModule(FEATURES, hidden))
    m.add(act() if act else cx.ReLUModule())
    if dropout:
        m.add(cx.DropoutModule(dropout))
    m.add(cx.LinearModule(hidden, CLASSES))
    return m


def config(**kw):
    c = D.DistributedTrainingConfig()
    c.verbose = False
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def hist(h):
    out = {}
    for k in HISTORY:
        v = getattr(h, k)
        out[k] = [float(a) for a in v] if isinstance(v, (list, tuple)) else v
    return out


def params(model):
    return [p.tolist() for p in model.parameters()]


def digest(model):
    s = hashlib.sha256()
    for p in model.parameters():
        s.update(np.ascontiguousarray(p).tobytes())
    return s.hexdigest()


def dump(tag, **kw):
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / f"{tag}.{RANK}.json").write_text(json.dumps(kw))
'''

# Environment of a run without any launcher variables: a world of one.
UNSET = {"RANK": "<unset>", "WORLD_SIZE": "<unset>", "MASTER_ADDR": "<unset>", "MASTER_PORT": "<unset>",
         "LOCAL_RANK": "<unset>", "DISTRIBUTED_TIMEOUT_MS": "<unset>"}


def run(ranks, code: str, world_size: int, timeout: float = 45, **kw):
    """Runs every rank (a fresh port each time); all must exit 0."""
    ranks.port = free_port()
    results = ranks.run(code, world_size, timeout=timeout, **kw)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    return results


def outputs(where, tag: str, world_size: int) -> list[dict]:
    """The reports of `tag`, by rank; `where` is the test's tmp_path or its `ranks` fixture."""
    base = Path(getattr(where, "tmp_path", where))
    out = []
    for r in range(world_size):
        path = base / "out" / f"{tag}.{r}.json"
        assert path.exists(), f"rank {r} wrote no {path.name}"
        out.append(json.loads(path.read_text()))
    return out
