"""pycyxwiz.distributed: data-parallel communication.

    import pycyxwiz as cx
    cx.distributed.init()                      # RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, torchrun, srun, mpirun
    cx.distributed.all_reduce(grad, op=cx.distributed.ReduceOp.AVG)
    cx.distributed.finalize()

See docs/distributed.md.
"""

import atexit as _atexit

from .._core.distributed import (  # noqa: F401
    BackendType,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistributedConfig,
    DistStoreError,
    DistTimeoutError,
    ReduceOp,
    Work,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    finalize,
    get_backend,
    get_config,
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    is_master,
    reduce_scatter,
)

# A script that ends without finalize() still leaves the job cleanly: its peers see a goodbye,
# not a dead rank.
_atexit.register(finalize)
