"""The NCCL backend's timeout and abort path, driven by the host emulator of the CUDA library
(tests/gpu/emulator): its CYXWIZ_EMULATED_NCCL_HANG=1 makes every collective hang, as a peer that never
calls it would. A real GPU cannot stage that with one process, so these tests run only under the
emulator (CYXWIZ_CUDA_LIBRARY=.../libcyxwiz_cuda_emulated.so) and skip elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from harness import free_port, rank_env

EMULATED = os.environ.get("CYXWIZ_CUDA_LIBRARY", "").endswith("libcyxwiz_cuda_emulated.so")
pytestmark = pytest.mark.skipif(not EMULATED, reason="needs the host emulator (CYXWIZ_CUDA_LIBRARY=...emulated.so)")

HANGING_ALL_REDUCE = r"""
import json, time
import numpy as np
import pycyxwiz as cx
D = cx.distributed
D.init()
out = {}
t = cx.Tensor(np.ones(1000, np.float32)).to("cuda")
for attempt in ("first", "second"):
    start = time.monotonic()
    try:
        D.all_reduce(t)
        out[attempt] = ["returned", "", time.monotonic() - start]
    except D.DistError as e:
        out[attempt] = [type(e).__name__, str(e), time.monotonic() - start]
# Broken: host arrays (the TCP ring) fail with the same error too.
try:
    D.all_reduce(np.ones(3, np.float32))
    out["host"] = ["returned", ""]
except D.DistError as e:
    out["host"] = [type(e).__name__, str(e)]
# Finalize must still return, and a CPU world forms afterwards.
D.finalize()
cfg = D.DistributedConfig.from_environment()
cfg.backend = D.BackendType.CPU
D.init(cfg)
a = np.full(3, 2.0, np.float32)
D.all_reduce(a)
out["cpu_after"] = a.tolist()
D.finalize()
print("RESULT " + json.dumps(out))
"""


def test_a_collective_that_never_completes_times_out_and_aborts():
    env = rank_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   DISTRIBUTED_BACKEND="nccl", DISTRIBUTED_TIMEOUT_MS="1500", CYXWIZ_EMULATED_NCCL_HANG="1")
    proc = subprocess.run([sys.executable, "-c", HANGING_ALL_REDUCE], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    kind, message, elapsed = out["first"]
    assert kind == "DistTimeoutError", out
    assert "[rank 0/1 on cuda:0] all_reduce #1 (float32, 1000 elements)" in message, message
    assert "DISTRIBUTED_TIMEOUT_MS=1500" in message and "aborted" in message, message
    assert 1.4 < elapsed < 6.0, f"timed out after {elapsed:.2f} s for a 1.5 s timeout"
    kind2, message2, elapsed2 = out["second"]
    assert (kind2, message2) == (kind, message), "a broken backend fails fast with the original error"
    assert elapsed2 < 0.5, elapsed2
    assert out["host"] == [kind, message], "host-array collectives of a broken backend fail with it too"
    assert out["cpu_after"] == [2.0, 2.0, 2.0]
