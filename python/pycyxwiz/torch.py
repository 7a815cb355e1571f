"""pycyxwiz as a torch.distributed backend for CPU tensors.

    import pycyxwiz.torch          # registers the backend "cyxwiz"
    dist.init_process_group("cyxwiz")

Every torch process group (the default one and each ``new_group``) gets a communicator of its own,
``cx.distributed._Group``: the TCP ring, its own links, its own communication thread. Rendezvous goes
through the store torch hands the backend: rank 0 serves the group's rendezvous on a free port and
publishes it there with a fresh per-group secret, so no port beyond torch's own is configured.
Collectives return at once; the ring thread runs them in call order, so DDP's bucket all-reduces
overlap backward. Contiguous float32/float64/int32/int64 tensors are reduced in place without a copy;
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
_BITWISE_OPS = {_R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or, _R.BXOR: torch.bitwise_xor}
_NATIVE_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
# What other dtypes travel as: 16-bit floats are reduced in float32, small integers and bool in int64.
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.int8: torch.int64,
          torch.uint8: torch.int64, torch.int16: torch.int64, torch.bool: torch.int64}


def _op_of(op, rank: int) -> object:
    """torch's ReduceOp (or its RedOpType) as ours; bitwise ops are handled by the caller."""
    kind = op.op if hasattr(op, "op") else op
    for t, ours in _NATIVE_OPS.items():
        if kind == t:
            return ours
    raise ValueError(f"cyxwiz backend, rank {rank}: ReduceOp {kind} is not supported (SUM, AVG, PRODUCT, MIN, MAX, "
                     f"BAND, BOR, BXOR are)")


class _Buffer:
    """A tensor as the communicator sees it: its own memory when it can, else a contiguous copy of a
    dtype the ring reduces, written back by ``done()``."""

    def __init__(self, tensor: torch.Tensor, what: str, rank: int):
        if tensor.device.type != "cpu":
            raise ValueError(f"cyxwiz backend, rank {rank}: {what} got a tensor on {tensor.device}; it moves CPU "
                             f"tensors. Use backend=\"nccl\" for GPU tensors, or init_process_group(backend="
                             f"\"cpu:cyxwiz,cuda:nccl\")")
        if tensor.layout != torch.strided:
            raise TypeError(f"cyxwiz backend, rank {rank}: {what} got a {tensor.layout} tensor; it moves dense "
                            f"tensors. Pass tensor.to_dense(), or use backend=\"gloo\" for sparse all_reduce")
        self.tensor = tensor
        wide = _WIDER.get(tensor.dtype)
        if wide is None and tensor.dtype not in _NATIVE_DTYPES:
            raise TypeError(f"cyxwiz backend, rank {rank}: {what} does not move {tensor.dtype} tensors; convert to "
                            f"float32, float64 or an integer type first")
        self.copied = wide is not None or not tensor.is_contiguous()
        self.view = (tensor.to(wide) if wide is not None else tensor.contiguous()) if self.copied else tensor
        self.array = self.view.detach().numpy()

    def done(self) -> None:
        if self.copied:
            with torch.no_grad():
                self.tensor.copy_(self.view.to(self.tensor.dtype))


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
        self._done = pending is None
        self._future = torch.futures.Future()
        self._completer = completer  # completes the future once someone asks for it (get_future)
        self._watched = False
        if self._done:
            self._settle()

    def _settle(self) -> None:
        try:
            if self._finish is not None:
                self._finish()  # into the buffers (a bitwise reduction), before they are written back
            for b in self._buffers:
                b.done()
        except BaseException as e:  # noqa: BLE001 - kept for wait()/the future
            self._error = e
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
            self._done = True
            self._settle()
            if self._error is not None and reraise:
                raise self._error

    def wait(self, timeout=timedelta(0)) -> bool:
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
            if not self._done and not self._watched and self._completer is not None:
                self._watched = True
                self._completer.add(self)
        return self._future

    def result(self):
        self.wait()
        return self._outputs


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
    """A communicator for this group, through torch's (per-group prefixed) store."""
    config = D.DistributedConfig()
    config.rank, config.world_size = rank, size
    config.local_rank = int(os.environ.get("LOCAL_RANK", rank)) if size > 1 else 0
    config.timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    if size == 1:
        return D._Group(config)
    host = socket.gethostname()
    store.set(f"cyxwiz/host/{rank}", host)
    if rank != 0:
        info = json.loads(store.get("cyxwiz/rendezvous").decode())
        config.master_addr, config.master_port, config.secret = info["addr"], info["port"], info["secret"]
        config.job_id = info["job"]
        return _call(lambda: D._Group(config))
    hosts = {store.get(f"cyxwiz/host/{r}").decode() for r in range(size)}
    # One machine: loopback only. Several: the address the others reach rank 0 on.
    config.master_addr = "127.0.0.1" if hosts == {host} else (os.environ.get("MASTER_ADDR") or
                                                              socket.gethostbyname(host))
    config.master_port = 0
    config.secret = secrets.token_hex(32)
    config.job_id = secrets.token_hex(8)

    def served_on(port: int) -> None:
        store.set("cyxwiz/rendezvous", json.dumps({"addr": config.master_addr, "port": port,
                                                   "secret": config.secret, "job": config.job_id}))
    return _call(lambda: D._Group(config, served_on))


def _call(fn):
    try:
        return fn()
    except D.DistError as e:
        raise _torch_error(e) from e


class CyxwizProcessGroup(dist.ProcessGroup):
    """The "cyxwiz" backend: a torch ProcessGroup over one pycyxwiz communicator."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._group = _rendezvous(store, rank, size, timeout)
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
            if b.view.dtype.is_floating_point:
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
        buffers = [_Buffer(t, "all_reduce", self.rank()) for t in tensors]
        pending, finish = self._all_reduce_buffers(buffers, op, _is_async(opts))
        return self._start(pending, buffers, tensors, finish)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        buffers = [_Buffer(t, "all_reduce_coalesced", self.rank()) for t in tensors]
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

    def allgather(self, output_tensors, input_tensors, opts=None):
        world = self.size()
        staged = []
        pending = None
        for outs, inp in zip(output_tensors, input_tensors):
            flat = torch.empty((world,) + tuple(inp.shape), dtype=inp.dtype)
            pending, dst = self._gather_into(flat, inp, "all_gather")
            staged.append((outs, flat, dst))

        def scatter_out():
            with torch.no_grad():
                for outs, flat, dst in staged:
                    dst.done()
                    for r, o in enumerate(outs):
                        o.copy_(flat[r])
        return self._start(pending, [], output_tensors, scatter_out)

    # dist.all_gather_coalesced calls this on the group itself; without it torch's base method looks for
    # a C++ backend and fails with "No backend type associated with device type cpu".
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][j] receives rank r's input_list[j]."""
        world = self.size()
        staged = []
        pending = None
        for j, inp in enumerate(input_list):
            if inp.numel() == 0:  # same shapes on every rank: nothing to move
                continue
            flat = torch.empty((world,) + tuple(inp.shape), dtype=inp.dtype)
            pending, dst = self._gather_into(flat, inp, "all_gather_coalesced")
            staged.append((j, flat, dst))

        def scatter_out():
            with torch.no_grad():
                for j, flat, dst in staged:
                    dst.done()
                    for r in range(world):
                        output_lists[r][j].copy_(flat[r])
        return self._start(pending, [], output_lists, scatter_out)

    def _scatter_into(self, output, input, opts, what: str):
        op = opts.reduceOp if opts is not None else _R.SUM
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"cyxwiz backend, rank {self.rank()}: {what} needs an input of "
                             f"world_size x {output.numel()} elements, got {input.numel()}")
        src = _Buffer(input, what, self.rank())
        dst = _Buffer(output, what, self.rank())
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

    # Built from the ring's collectives: correct, not tuned (each moves the whole world's data).
    def reduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        buffers = [_Buffer(t, "reduce", self.rank()) for t in tensors]
        pending, finish = self._all_reduce_buffers(buffers, op)
        return self._start(pending, buffers, tensors, finish)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        outs = output_tensors[0] if self.rank() == root else [torch.empty_like(input_tensors[0])
                                                               for _ in range(self.size())]
        return self.allgather([outs], input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        full = (torch.stack([t.reshape(out.shape) for t in input_tensors[0]]) if self.rank() == root
                else torch.empty((self.size(),) + tuple(out.shape), dtype=out.dtype))
        work = self.broadcast([full], _broadcast_options(root))
        work.wait()
        with torch.no_grad():
            out.copy_(full[self.rank()])
        return self._start(None, [], output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        world = self.size()
        # Split sizes that are all equal are the equal split (the functional all_to_all_single passes them).
        if not (_even_split(output_split_sizes, output.shape[0], world) and
                _even_split(input_split_sizes, input.shape[0], world)):
            raise NotImplementedError(f"cyxwiz backend, rank {self.rank()}: all_to_all_single with unequal split sizes "
                                      "is not supported yet; pass equal splits, or use backend=\"gloo\" for this "
                                      "call's group")
        everything = torch.empty((world,) + tuple(input.shape), dtype=input.dtype)
        pending, dst = self._gather_into(everything, input, "all_to_all_single")
        self._start(pending, [dst], []).wait()
        chunk = input.shape[0] // world
        with torch.no_grad():
            for r in range(world):
                output[r * chunk:(r + 1) * chunk].copy_(everything[r][self.rank() * chunk:(self.rank() + 1) * chunk])
        return self._start(None, [], [output])

    alltoall_base = all_to_all_single

    def _no_point_to_point(self):
        return NotImplementedError(f"cyxwiz backend, rank {self.rank()}: send/recv are not supported yet; use the "
                                   "collectives, or backend=\"gloo\" for point-to-point")

    def send(self, tensors, dst, tag=0):
        raise self._no_point_to_point()

    def recv(self, tensors, src, tag=0):
        raise self._no_point_to_point()

    def shutdown(self) -> None:
        self._completer.stop()
        self._group.shutdown()

    def abort(self) -> None:
        self.shutdown()


def _is_async(opts) -> bool:
    """torch says whether the caller waits at once (async_op=False): then the collective runs on the
    calling thread, as cx.distributed's blocking calls do, without a hand-over to the ring's thread."""
    return bool(getattr(opts, "asyncOp", True)) if opts is not None else True


def _even_split(splits, rows: int, world: int) -> bool:
    """No split sizes, or world_size equal ones that cover the rows."""
    return not splits or (len(splits) == world and all(n * world == rows for n in splits))


def _broadcast_options(root: int):
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o


def _create(store, rank, size, timeout):
    return CyxwizProcessGroup(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
