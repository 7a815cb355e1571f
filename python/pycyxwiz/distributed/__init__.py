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
    convert_sync_batchnorm,
    finalize,
    get_backend,
    get_config,
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    is_master,
    recv,
    reduce_scatter,
    send,
)
from .._core.distributed import DistributedTrainer as _CoreTrainer
from .._core.distributed import _all_to_all, _gather, _scatter, _shared_zeros  # noqa: F401
from .._core.distributed import _Group  # noqa: F401 - a communicator of its own, for pycyxwiz.torch
from .._progress import ProgressPrinter as _ProgressPrinter
from ._spawn import SpawnError, spawn  # noqa: F401


class DistributedTrainer(_CoreTrainer):
    __doc__ = _CoreTrainer.__doc__

    def __init__(self, model, loss_fn, optimizer, ddp_config=None):
        super().__init__(model, loss_fn, optimizer, ddp_config)
        self._set_progress(_ProgressPrinter())  # rank 0 only, when config.verbose


def gather(array, dst=0, async_op=False):
    """Every rank's array on rank `dst`, as a list indexed by rank (None on the other ranks).
    With async_op=True: a Work whose result() is that list (or None)."""
    import numpy as np

    array = np.asarray(array)
    out = np.empty((get_world_size(),) + array.shape, dtype=array.dtype) if get_rank() == dst else None
    return _gather(array, out, list(out) if out is not None else None, dst, async_op)


def scatter(array, parts=None, src=0, async_op=False):
    """Rank `src`'s parts[r] into rank r's `array` (in place). `parts` (on `src` only): world_size arrays
    shaped like `array`."""
    import numpy as np

    full = None
    if get_rank() == src:
        if parts is None or len(parts) != get_world_size():
            raise ValueError(f"scatter: rank {src} (the source) must pass parts, one array per rank "
                             f"({get_world_size()}), got {None if parts is None else len(parts)}")
        full = np.stack([np.asarray(p, dtype=np.asarray(array).dtype).reshape(np.shape(array)) for p in parts])
    return _scatter(full, array, src, async_op)


def all_to_all(array, out, in_splits=None, out_splits=None, async_op=False):
    """Rows in_splits[r] of `array` (along its first axis, in rank order) go to rank r, which puts them
    in `out` at the rows out_splits[this rank] names. Splits None: equal parts of the first axis
    (torch.distributed.all_to_all_single's contract)."""
    import numpy as np

    array, n = np.asarray(array), get_world_size()

    def counts(a, splits, what):
        rows = a.shape[0] if a.ndim else 1
        if splits is None:
            if rows % n:
                raise ValueError(f"all_to_all: {what} has {rows} rows, which do not split evenly over {n} ranks; "
                                 f"pass {what}_splits")
            splits = [rows // n] * n
        per_row = a.size // rows if rows else 0
        return [int(s) * per_row for s in splits]

    return _all_to_all(array, out, counts(array, in_splits, "in"), counts(np.asarray(out), out_splits, "out"), async_op)


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
