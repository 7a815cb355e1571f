"""pycyxwiz as a torch.distributed backend for CPU tensors.

    import pycyxwiz.torch          # registers the backend "cyxwiz"
    dist.init_process_group("cyxwiz")

Every torch process group (the default one and each ``new_group``) gets a communicator of its own,
``cx.distributed._Group``: the TCP ring, its own links, its own communication thread. Rendezvous goes
through the store torch hands the backend: rank 0 serves the group's rendezvous on a free port and
publishes it there with a fresh per-group secret, so no port beyond torch's own is configured.
Collectives return at once; the ring thread runs them in call order, so DDP's bucket all-reduces
overlap backward (without 2 cores per rank on the host, async all_reduces run on the caller instead:
_overlaps). gather, scatter, all_to_all and send/recv travel over point-to-point links. Contiguous float32/float64/int32/int64 tensors are reduced in place without a copy;
other dtypes and non-contiguous tensors go through a contiguous copy (16-bit floats reduced in
float32). CUDA tensors are refused: use "nccl". See docs/pytorch.md.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import socket
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

import pycyxwiz as cx

__all__ = ["BACKEND", "CyxwizProcessGroup", "DistTimeoutError"]

BACKEND = "cyxwiz"
D = cx.distributed
_R = dist.ReduceOp
_NATIVE_OPS = {_R.SUM: D.ReduceOp.SUM, _R.AVG: D.ReduceOp.AVG, _R.PRODUCT: D.ReduceOp.PRODUCT,
               _R.MIN: D.ReduceOp.MIN, _R.MAX: D.ReduceOp.MAX}
# The same by the enum's value (allreduce's fast path): an int hashes in a fraction of the time a
# pybind enum takes.
_NATIVE_BY_VALUE = {int(t): ours for t, ours in _NATIVE_OPS.items()}
_BITWISE_OPS = {_R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or, _R.BXOR: torch.bitwise_xor}
# What the core moves as it is; bfloat16 (no numpy dtype) travels as its int16 bits, and a reduction
# combines 16-bit floats in float32, so that its result is float32-exact.
_NATIVE_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.int16, torch.int8,
                  torch.uint8, torch.bool)
_AS_BITS = {torch.bfloat16: torch.int16}
_REDUCED_IN_FLOAT32 = (torch.float16, torch.bfloat16)


def _op_of(op, rank: int) -> object:
    """torch's ReduceOp (or its RedOpType) as ours; bitwise ops are handled by the caller."""
    kind = op.op if hasattr(op, "op") else op
    for t, ours in _NATIVE_OPS.items():
        if kind == t:
            return ours
    raise ValueError(f"cyxwiz backend, rank {rank}: ReduceOp {kind} is not supported (SUM, AVG, PRODUCT, MIN, MAX, "
                     f"BAND, BOR, BXOR are)")


def _numpy(t: torch.Tensor):
    """A numpy view of a CPU tensor; detach() (a new tensor object) only where numpy() needs it."""
    return t.detach().numpy() if t.requires_grad else t.numpy()


class _Buffer:
    """A tensor as the communicator sees it: its own memory when it can (contiguous, a dtype the core
    moves), else a contiguous copy written back by ``done()``. ``reduce``: the values are combined,
    so 16-bit floats go through float32."""

    __slots__ = ("tensor", "copied", "view", "array")

    def __init__(self, tensor: torch.Tensor, what: str, rank: int, reduce: bool = False):
        # The common case first, with the fewest checks: a contiguous CPU tensor the core takes as is.
        if (tensor.is_cpu and tensor.layout == torch.strided and tensor.dtype in _NATIVE_DTYPES
                and not (reduce and tensor.dtype in _REDUCED_IN_FLOAT32) and tensor.is_contiguous()):
            self.tensor = self.view = tensor
            self.copied = False
            self.array = _numpy(tensor)
            return
        if tensor.device.type != "cpu":
            raise ValueError(f"cyxwiz backend, rank {rank}: {what} got a tensor on {tensor.device}; it moves CPU "
                             f"tensors. Use backend=\"nccl\" for GPU tensors, or init_process_group(backend="
                             f"\"cpu:cyxwiz,cuda:nccl\")")
        if tensor.layout != torch.strided:
            raise TypeError(f"cyxwiz backend, rank {rank}: {what} got a {tensor.layout} tensor; it moves dense "
                            f"tensors. Pass tensor.to_dense(), or use backend=\"gloo\" for sparse all_reduce")
        self.tensor = tensor
        dtype = tensor.dtype
        if dtype not in _NATIVE_DTYPES and dtype not in _AS_BITS:
            raise TypeError(f"cyxwiz backend, rank {rank}: {what} does not move {dtype} tensors; convert to a "
                            f"float or integer type first")
        if reduce and dtype in _REDUCED_IN_FLOAT32:
            self.copied, self.view = True, tensor.to(torch.float32)
        else:
            self.copied = not tensor.is_contiguous()
            view = tensor.contiguous() if self.copied else tensor
            self.view = view.view(_AS_BITS[dtype]) if dtype in _AS_BITS else view
        self.array = _numpy(self.view)

    def done(self) -> None:
        if self.copied:
            with torch.no_grad():
                bits = self.tensor.dtype in _AS_BITS and self.view.dtype == _AS_BITS[self.tensor.dtype]
                self.tensor.copy_(self.view.view(self.tensor.dtype) if bits else self.view.to(self.tensor.dtype))


class _Completer:
    """Completes the torch Futures of running collectives, in order, on one thread per group: a
    collective's Future is what DDP's reducer and communication hooks wait on."""

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="cyxwiz-futures", daemon=True)
        self._thread.start()

    def add(self, work: "_Work") -> None:
        self._jobs.put(work)

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            work = self._jobs.get()
            if work is None:
                return
            work._complete(reraise=False)  # the error stays with the Work and its future


class _Work(dist._Work):
    """One collective: ``wait`` (bounded by the group's timeout), ``is_completed``, ``exception``,
    ``get_future`` (its value is the collective's output tensors)."""

    def __init__(self, pending, buffers, outputs, finish=None, completer=None):
        super().__init__()
        self._pending = pending     # cx.distributed.Work, or None when already done
        self._buffers = buffers     # written back when done
        self._outputs = outputs     # the future's value
        self._finish = finish       # host-side step after the ring's (bitwise reductions, gathers' copies)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._future = None          # made when get_future() asks (DDP does; a plain wait does not)
        self._completer = completer  # completes the future once someone asks for it (get_future)
        self._done = False           # set once the buffers are written back: wait()'s fast path reads it unlocked
        if pending is None:
            self._settle()
            self._done = True

    def _settle(self) -> None:
        try:
            if self._finish is not None:
                self._finish()  # into the buffers (a bitwise reduction), before they are written back
            for b in self._buffers:
                b.done()
        except BaseException as e:  # noqa: BLE001 - kept for wait()/the future
            self._error = e
        if self._future is not None:
            self._resolve()

    def _resolve(self) -> None:
        if self._error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(self._error)

    def _complete(self, timeout=None, reraise=True) -> None:
        with self._lock:
            if self._done:
                if self._error is not None and reraise:
                    raise self._error
                return
            try:
                self._pending.wait(timeout)
            except D.DistError as e:
                if timeout is not None and isinstance(e, D.DistTimeoutError):
                    raise _torch_error(e) from e  # the collective goes on: a later wait may see it finish
                self._error = _torch_error(e)
            self._settle()
            self._done = True
            if self._error is not None and reraise:
                raise self._error

    def wait(self, timeout=timedelta(0)) -> bool:
        if self._done and self._error is None:  # a blocking call's Work, or one waited for already
            return True
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        self._complete(seconds if seconds else None)
        return True

    def is_completed(self) -> bool:
        return self._done or (self._pending is not None and self._pending.is_completed())

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    self._resolve()
                elif self._completer is not None:
                    self._completer.add(self)
        return self._future

    def result(self):
        self.wait()
        return self._outputs

    def _source_rank(self) -> int:
        """A recv's sender (torch's dist.recv(src=None) asks), once it is done."""
        self.wait()
        return self._pending.source_rank if self._pending is not None else -1


class _DoneWork(dist._Work):
    """A collective that already ran on the caller's thread (async_op=False) with nothing to write
    back: the Work torch asks for, at a fraction of _Work's cost (blocking small calls pay it each time)."""

    def __init__(self, outputs):
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(self._outputs)
        return future

    def result(self):
        return self._outputs

    def _source_rank(self) -> int:
        return -1


class DistTimeoutError(dist.DistBackendError, TimeoutError):
    """A collective or the rendezvous ran past init_process_group's timeout: torch's DistBackendError
    (what c10d raises for a timeout) and Python's TimeoutError."""


def _torch_error(e: BaseException) -> BaseException:
    """Our error as torch's own class, with our message (rank, operation, peer, remedy)."""
    if isinstance(e, D.DistTimeoutError):
        err = DistTimeoutError(f"{e} (with torch.distributed: raise init_process_group(timeout=...))")
        err.__cause__ = e
        return err
    if isinstance(e, D.DistNetworkError):
        cls = dist.DistNetworkError
    elif isinstance(e, D.DistStoreError):
        cls = dist.DistStoreError
    else:
        cls = dist.DistBackendError
    err = cls(str(e))
    err.__cause__ = e
    return err


def _rendezvous(store, rank: int, size: int, timeout: timedelta):
    """A communicator for this group, through torch's (per-group prefixed) store, and how many of the
    group's ranks are on this host."""
    config = D.DistributedConfig()
    config.rank, config.world_size = rank, size
    config.local_rank = int(os.environ.get("LOCAL_RANK", rank)) if size > 1 else 0
    config.timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    if size == 1:
        return D._Group(config), 1
    host = socket.gethostname()
    store.set(f"cyxwiz/host/{rank}", host)
    if rank != 0:
        info = json.loads(store.get("cyxwiz/rendezvous").decode())
        config.master_addr, config.master_port, config.secret = info["addr"], info["port"], info["secret"]
        config.job_id = info["job"]
        return _call(lambda: D._Group(config)), info["hosts"].count(host)
    hosts = [store.get(f"cyxwiz/host/{r}").decode() for r in range(size)]
    # One machine: loopback only. Several: the address the others reach rank 0 on.
    config.master_addr = "127.0.0.1" if set(hosts) == {host} else (os.environ.get("MASTER_ADDR") or
                                                                   socket.gethostbyname(host))
    config.master_port = 0
    config.secret = secrets.token_hex(32)
    config.job_id = secrets.token_hex(8)

    def served_on(port: int) -> None:
        store.set("cyxwiz/rendezvous", json.dumps({"addr": config.master_addr, "port": port, "hosts": hosts,
                                                   "secret": config.secret, "job": config.job_id}))
    return _call(lambda: D._Group(config, served_on)), hosts.count(host)


def _overlaps(ranks_here: int, rank: int) -> bool:
    """DDP's overlap policy (docs/distributed.md): an all_reduce started with async_op=True runs on the
    communication thread when this host has 2 cores per rank of the group, else on the calling thread
    before the call returns (a finished Work): without a spare core the thread's work only takes time
    from the ranks' computation. CYXWIZ_DDP_OVERLAP=1/0 forces either."""
    flag = os.environ.get("CYXWIZ_DDP_OVERLAP", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    if flag:
        raise ValueError(f"cyxwiz backend, rank {rank}: CYXWIZ_DDP_OVERLAP='{os.environ['CYXWIZ_DDP_OVERLAP']}' is "
                         f"not a flag: set it to 1 or 0 (also true/false, yes/no, on/off), or unset it")
    return 2 * ranks_here <= (os.cpu_count() or 1)


def _call(fn):
    try:
        return fn()
    except D.DistError as e:
        raise _torch_error(e) from e


class CyxwizProcessGroup(dist.ProcessGroup):
    """The "cyxwiz" backend: a torch ProcessGroup over one pycyxwiz communicator."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank = rank  # self.rank() is a call into C++: the hot paths read this
        self._group, ranks_here = _rendezvous(store, rank, size, timeout)
        self._overlap = _overlaps(ranks_here, rank)  # async all_reduces on the communication thread
        self._completer = _Completer()

    # ---- what torch asks of every backend ----
    def getBackendName(self) -> str:
        return BACKEND

    # A Python ProcessGroup keeps its own name and description (DeviceMesh and FSDP look them up).
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def _start(self, pending, buffers, outputs, finish=None) -> _Work:
        return _Work(pending, buffers, outputs, finish, self._completer)

    def _all_reduce_buffers(self, buffers, op, run_async=True):
        kind = op.op if hasattr(op, "op") else op
        if kind in _BITWISE_OPS:
            return self._bitwise(buffers, _BITWISE_OPS[kind])
        ours = _op_of(op, self.rank())
        pending = None
        for b in buffers:
            pending = _call(lambda b=b: self._group.all_reduce(b.array, ours, async_op=run_async))
        return pending, None

    def _bitwise(self, buffers, fn):
        """BAND/BOR/BXOR: gather every rank's bits and combine them here (exact for integers and bool)."""
        world = self.size()
        gathered = []
        pending = None
        for b in buffers:
            if b.tensor.dtype.is_floating_point:
                raise TypeError(f"cyxwiz backend, rank {self.rank()}: BAND/BOR/BXOR need integer or bool tensors")
            out = torch.empty((world,) + tuple(b.view.shape), dtype=b.view.dtype)
            pending = _call(lambda b=b, out=out: self._group.all_gather(b.array, out.numpy(), async_op=True))
            gathered.append((b, out))

        def combine():
            for b, out in gathered:
                acc = out[0].clone()
                for r in range(1, world):
                    acc = fn(acc, out[r])
                b.view.copy_(acc)
        return pending, combine

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        run_async = self._overlap and _is_async(opts)
        if len(tensors) == 1:
            # dist.all_reduce and DDP's buckets: one tensor, usually one the ring reduces in place. The
            # fewest Python steps: a small all-reduce costs little more than this call itself.
            t = tensors[0]
            ours = _NATIVE_BY_VALUE.get(int(op.op if type(op) is _R else op))
            if (ours is not None and t.is_cpu and t.layout == torch.strided and t.dtype in _NATIVE_DTYPES
                    and t.dtype not in _REDUCED_IN_FLOAT32 and t.is_contiguous()):
                try:
                    pending = self._group.all_reduce(_numpy(t), ours, run_async)
                except D.DistError as e:
                    raise _torch_error(e) from e
                return _DoneWork(tensors) if pending is None else _Work(pending, (), tensors, None, self._completer)
        buffers = [_Buffer(t, "all_reduce", self._rank, reduce=True) for t in tensors]
        pending, finish = self._all_reduce_buffers(buffers, op, run_async)
        return self._start(pending, buffers, tensors, finish)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        buffers = [_Buffer(t, "all_reduce_coalesced", self.rank(), reduce=True) for t in tensors]
        pending, finish = self._all_reduce_buffers(buffers, op)
        return self._start(pending, buffers, tensors, finish)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        buffers = [_Buffer(t, "broadcast", self.rank()) for t in tensors]
        run_async = _is_async(opts)
        pending = None
        for b in buffers:
            pending = _call(lambda b=b: self._group.broadcast(b.array, root, async_op=run_async))
        return self._start(pending, buffers, tensors)

    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor, what: str):
        src = _Buffer(inp, what, self.rank())
        dst = _Buffer(out, what, self.rank())
        pending = _call(lambda: self._group.all_gather(src.array, dst.array, async_op=True))
        return pending, dst

    def all_gather_single(self, output, input, opts=None):
        pending, dst = self._gather_into(output, input, "all_gather_into_tensor")
        return self._start(pending, [dst], [output])

    _allgather_base = all_gather_single

    def _allgather_staged(self, jobs, outputs, what: str) -> _Work:
        """All-gathers each (input, per_rank) of ``jobs`` into a (world, *input.shape) staging tensor; once
        the ring is done, row r is copied into the r-th tensor ``per_rank`` yields (it is iterated only
        then). One Work for them all: the ring runs them in call order."""
        world = self.size()
        staged = []
        pending = None
        for inp, per_rank in jobs:
            flat = torch.empty((world,) + tuple(inp.shape), dtype=inp.dtype)
            pending, dst = self._gather_into(flat, inp, what)
            staged.append((per_rank, flat, dst))

        def scatter_out():
            with torch.no_grad():
                for per_rank, flat, dst in staged:
                    dst.done()
                    for r, o in enumerate(per_rank):
                        o.copy_(flat[r])
        return self._start(pending, [], outputs, scatter_out)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._allgather_staged(zip(input_tensors, output_tensors), output_tensors, "all_gather")

    # dist.all_gather_coalesced calls this on the group itself; without it torch's base method looks for
    # a C++ backend and fails with "No backend type associated with device type cpu".
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][j] receives rank r's input_list[j]."""
        world = self.size()

        def column(j):  # output_lists[r][j] for r = 0, 1, ...: read as the copies are made
            return (output_lists[r][j] for r in range(world))
        # An empty input is skipped: same shapes on every rank, nothing to move.
        jobs = ((inp, column(j)) for j, inp in enumerate(input_list) if inp.numel() != 0)
        return self._allgather_staged(jobs, output_lists, "all_gather_coalesced")

    def _scatter_into(self, output, input, opts, what: str):
        op = opts.reduceOp if opts is not None else _R.SUM
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"cyxwiz backend, rank {self.rank()}: {what} needs an input of "
                             f"world_size x {output.numel()} elements, got {input.numel()}")
        src = _Buffer(input, what, self.rank(), reduce=True)
        dst = _Buffer(output, what, self.rank(), reduce=True)
        ours = _op_of(op, self.rank())
        pending = _call(lambda: self._group.reduce_scatter(src.array.reshape(-1), dst.array.reshape(-1), ours,
                                                          async_op=True))
        return pending, dst

    def reduce_scatter_single(self, output, input, opts=None):
        pending, dst = self._scatter_into(output, input, opts, "reduce_scatter_tensor")
        return self._start(pending, [dst], [output])

    _reduce_scatter_base = reduce_scatter_single

    # The coalesced forms, by the names torch's _coalescing_manager and the functional collectives
    # (all_gather_into_tensor_coalesced, reduce_scatter_tensor_coalesced) call; without them torch's base
    # methods look for a C++ backend ("No backend type associated with device type cpu"). One Work: the
    # ring runs them in order, so the last one done means all are.
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        pending, dsts = None, []
        for out, inp in zip(outputs, inputs):
            pending, dst = self._gather_into(out, inp, "all_gather_into_tensor_coalesced")
            dsts.append(dst)
        return self._start(pending, dsts, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        pending, dsts = None, []
        for out, inp in zip(outputs, inputs):
            pending, dst = self._scatter_into(out, inp, opts, "reduce_scatter_tensor_coalesced")
            dsts.append(dst)
        return self._start(pending, dsts, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        pending = None
        works = []
        for out, ins in zip(output_tensors, input_tensors):
            flat = torch.cat([i.reshape(-1) for i in ins])
            works.append(self.reduce_scatter_single(out, flat, opts))
        return works[-1] if works else self._start(pending, [], output_tensors)

    def barrier(self, opts=None):
        return self._start(_call(lambda: self._group.barrier(async_op=True)), [], [])

    # An all-reduce: the ring's bandwidth-optimal path; every rank gets the result, the root keeps it.
    def reduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        buffers = [_Buffer(t, "reduce", self.rank(), reduce=True) for t in tensors]
        pending, finish = self._all_reduce_buffers(buffers, op)
        return self._start(pending, buffers, tensors, finish)

    # Over the point-to-point links: each rank's block goes straight to the one rank that needs it.
    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        src = _Buffer(input_tensors[0], "gather", self.rank())
        if self.rank() != root:
            return self._start(_call(lambda: self._group.gather(src.array, None, root, async_op=True)), [], [])
        flat = _Buffer(torch.empty((self.size(),) + tuple(src.tensor.shape), dtype=src.tensor.dtype), "gather",
                       self.rank())
        pending = _call(lambda: self._group.gather(src.array, flat.array, root, async_op=True))

        def copy_out():
            with torch.no_grad():
                for r, o in enumerate(output_tensors[0]):
                    o.copy_(flat.tensor[r].reshape(o.shape))
        return self._start(pending, [], output_tensors, copy_out)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        dst = _Buffer(output_tensors[0], "scatter", self.rank())
        full = None
        if self.rank() == root:
            parts = [t.reshape(dst.tensor.shape).to(dst.tensor.dtype) for t in input_tensors[0]]
            full = _Buffer(torch.stack(parts), "scatter", self.rank()).array
        pending = _call(lambda: self._group.scatter(full, dst.array, root, async_op=True))
        return self._start(pending, [dst], output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        src = _Buffer(input, "all_to_all_single", self.rank())
        dst = _Buffer(output, "all_to_all_single", self.rank())
        counts_in = self._split_counts(input, input_split_sizes, "input")
        counts_out = self._split_counts(output, output_split_sizes, "output")
        pending = _call(lambda: self._group.all_to_all(src.array.reshape(-1), dst.array.reshape(-1), counts_in,
                                                       counts_out, async_op=True))
        return self._start(pending, [dst], [output])

    alltoall_base = all_to_all_single

    def _split_counts(self, t: torch.Tensor, splits, what: str) -> list:
        """Elements per rank from torch's split sizes (rows of dim 0; empty: equal parts)."""
        rows = t.shape[0] if t.dim() else 1
        per_row = t.numel() // rows if rows else 0
        if not splits:
            if rows % self.size():
                raise ValueError(f"cyxwiz backend, rank {self.rank()}: all_to_all_single: the {what} has {rows} rows, "
                                 f"which do not split evenly over {self.size()} ranks; pass {what}_split_sizes")
            splits = [rows // self.size()] * self.size()
        return [int(n) * per_row for n in splits]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        src = _Buffer(torch.cat([t.reshape(-1) for t in input_tensors]), "all_to_all", self.rank())
        out = _Buffer(torch.empty(sum(t.numel() for t in output_tensors), dtype=src.tensor.dtype), "all_to_all",
                      self.rank())
        counts_in = [t.numel() for t in input_tensors]
        counts_out = [t.numel() for t in output_tensors]
        pending = _call(lambda: self._group.all_to_all(src.array, out.array, counts_in, counts_out, async_op=True))

        def copy_out():
            with torch.no_grad():
                for o, part in zip(output_tensors, out.tensor.split(counts_out)):
                    o.copy_(part.reshape(o.shape))
        return self._start(pending, [], output_tensors, copy_out)

    # Point-to-point: eager sends (done once the bytes are on their way), recvs matched by source and tag.
    def send(self, tensors, dstRank, tag=0):
        b = _Buffer(tensors[0], "send", self.rank())
        return self._start(_call(lambda: self._group.send(b.array, dstRank, tag)), [], tensors)

    def recv(self, tensors, srcRank, tag=0):
        b = _Buffer(tensors[0], "recv", self.rank())
        return self._start(_call(lambda: self._group.recv(b.array, srcRank, tag)), [b], tensors)

    def recv_anysource(self, tensors, tag=0):
        return self.recv(tensors, -1, tag)

    def shutdown(self) -> None:
        self._completer.stop()
        self._group.shutdown()

    def abort(self) -> None:
        self.shutdown()


def _is_async(opts) -> bool:
    """torch says whether the caller waits at once (async_op=False): then the collective runs on the
    calling thread, as cx.distributed's blocking calls do, without a hand-over to the ring's thread."""
    return bool(getattr(opts, "asyncOp", True)) if opts is not None else True


def _create(store, rank, size, timeout):
    return CyxwizProcessGroup(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
