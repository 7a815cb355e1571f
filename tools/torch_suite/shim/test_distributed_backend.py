"""PyTorch's DistributedTest._DistTestBase (torch/testing/_internal/distributed/distributed_test.py,
shipped in the torch wheel) for the backend named by BACKEND, any name: PyTorch's own launcher for it,
test/distributed/test_distributed_spawn.py, runs only gloo, nccl and ucc and prints "Invalid backend"
for others. Same class, same setUp, same spawn start method; the sitecustomize beside this file has
registered a plugin backend in every process before distributed_test.py's decorators are evaluated.
Needs BACKEND, WORLD_SIZE and TEMP_DIR (with a file TEMP_DIR/barrier), as upstream."""

import os

import torch
from torch.testing._internal.common_utils import run_tests

BACKEND = os.environ["BACKEND"]
# TORCH_SUITE_GATES_OF=gloo: distributed_test.py decides what to skip as for gloo (its decorators read
# BACKEND when it is imported), and the tests then run on BACKEND (its _run reads the module's BACKEND
# when each rank starts). For tests that are gated by backend name only.
GATES_OF = os.environ.get("TORCH_SUITE_GATES_OF") or BACKEND
os.environ["BACKEND"] = GATES_OF
import torch.testing._internal.distributed.distributed_test as _dt  # noqa: E402

os.environ["BACKEND"] = BACKEND
_dt.BACKEND = BACKEND
DistributedTest, TestDistBackend = _dt.DistributedTest, _dt.TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


# The name carries the backend, as upstream's does (TestDistBackendWithSpawnGLOO...).
TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = f"TestDistBackendWithSpawn{BACKEND.upper()}"
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
del TestDistBackendWithSpawn

if __name__ == "__main__":
    run_tests()
