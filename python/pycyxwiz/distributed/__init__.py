"""pycyxwiz.distributed: data-parallel training.

    import pycyxwiz as cx
    cx.distributed.init()                      # RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, torchrun, srun, mpirun
    trainer = cx.distributed.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.001))
    history = trainer.fit(X, y, cx.distributed.DistributedTrainingConfig())
    cx.distributed.finalize()

See docs/distributed.md.
"""

import atexit as _atexit
import math as _math

from .._core.distributed import (  # noqa: F401
    BackendType,
    DDPConfig,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistributedBatchIterator,
    DistributedConfig,
    DistributedDataParallel,
    DistributedSampler,
    DistributedTrainingConfig,
    DistributedTrainingHistory,
    DistStoreError,
    DistTimeoutError,
    ReduceOp,
    TrainStep,
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
from .._core.distributed import DistributedTrainer as _CoreTrainer
from .._core.distributed import _Group  # noqa: F401 - a communicator of its own, for pycyxwiz.torch
from .._progress import ProgressPrinter as _ProgressPrinter
from ._spawn import SpawnError, spawn  # noqa: F401


class DistributedTrainer(_CoreTrainer):
    __doc__ = _CoreTrainer.__doc__

    def __init__(self, model, loss_fn, optimizer, ddp_config=None):
        super().__init__(model, loss_fn, optimizer, ddp_config)
        self._set_progress(_ProgressPrinter())  # rank 0 only, when config.verbose


def scale_learning_rate(base_lr, base_batch_size, rule="linear", batch_size=None, world_size=None):
    """The learning rate for an effective batch of batch_size x world_size, from one tuned for
    base_batch_size: "linear" (Goyal et al.) multiplies by the batch ratio, "sqrt" by its square root.
    batch_size defaults to base_batch_size (per rank), world_size to the job's."""
    if rule not in ("linear", "sqrt"):
        raise ValueError(f"scale_learning_rate: rule={rule!r} must be 'linear' or 'sqrt'")
    if base_lr < 0 or base_batch_size <= 0:
        raise ValueError(f"scale_learning_rate: base_lr={base_lr} must be >= 0 and base_batch_size={base_batch_size} > 0")
    if batch_size is None:
        batch_size = base_batch_size
    if world_size is None:
        world_size = get_world_size() if is_initialized() else 1
    if batch_size <= 0 or world_size <= 0:
        raise ValueError(f"scale_learning_rate: batch_size={batch_size} and world_size={world_size} must be positive")
    ratio = batch_size * world_size / base_batch_size
    return base_lr * (ratio if rule == "linear" else _math.sqrt(ratio))


# A script that ends without finalize() still leaves the job cleanly: its peers see a goodbye,
# not a dead rank.
_atexit.register(finalize)
