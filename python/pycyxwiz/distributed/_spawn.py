"""cx.distributed.spawn: start the ranks of a job from inside Python, as torch.multiprocessing.spawn.

    def train(local_rank, epochs):
        cx.distributed.init()               # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from spawn
        ...

    if __name__ == "__main__":
        cx.distributed.spawn(train, args=(10,), nprocs=4)

Each rank is a fresh interpreter (the "spawn" start method: no forked threads or sockets), so `fn`
must be importable (a module-level function) and the script needs the `__main__` guard. The parent
only watches: the first rank that fails stops the others, and spawn raises SpawnError with that rank's
traceback. Nothing waits forever: `timeout` bounds the whole job.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.connection
import os
import secrets
import time
import traceback
from typing import Any, Callable, Optional, Sequence

from .._procgroup import Watchdog, stop_groups, wait_unreaped

if os.name == "nt":  # a job object in place of process groups and the watchdog (see _winjob)
    from .. import _winjob

_GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL for the ranks that are still running


class SpawnError(RuntimeError):
    """A rank of spawn() failed (an exception, a non-zero exit, a signal) or the job timed out."""

    def __init__(self, message: str, rank: Optional[int] = None, exit_code: Optional[int] = None):
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code


def _run_rank(fn: Callable, local_rank: int, args: Sequence[Any], results) -> None:
    if hasattr(os, "setsid"):
        os.setsid()  # a process group of its own: what the rank starts is stopped with it (see _stop)
    try:
        value = fn(local_rank, *args)
    except BaseException as e:  # noqa: BLE001 - a rank's failure, whatever it is, goes to the parent
        from . import DistError  # a DistError is usually what another rank's failure did to this one
        results.put((local_rank, False, (traceback.format_exc(), isinstance(e, DistError))))
        raise SystemExit(1)
    try:
        results.put((local_rank, True, value))
    except Exception as e:  # noqa: BLE001 - an unpicklable result must not look like success
        results.put((local_rank, False, (f"its return value could not be sent to the parent: {e!r}", False)))
        raise SystemExit(1)


def _rank_env(rank: int, local_rank: int, world: int, nprocs: int, node_rank: int, addr: str, port: int,
              job_id: str, secret: Optional[str] = None) -> dict[str, str]:
    env = dict(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(nprocs),
               NODE_RANK=str(node_rank), MASTER_ADDR=addr, MASTER_PORT=str(port), CYXWIZ_JOB_ID=job_id)
    if secret is not None:
        env["CYXWIZ_SECRET"] = secret
    return env


def spawn(fn: Callable, args: Sequence[Any] = (), nprocs: int = 1, *, nnodes: int = 1, node_rank: int = 0,
          master_addr: Optional[str] = None, master_port: Optional[int] = None,
          timeout: Optional[float] = None) -> list:
    """Runs fn(local_rank, *args) in nprocs new processes, ranks node_rank * nprocs + local_rank of a
    world of nnodes * nprocs, and returns their return values by local rank.

    master_addr/master_port default to MASTER_ADDR/MASTER_PORT, then to 127.0.0.1 and a free port (one
    node); with several nodes, give every node the same master address and port, and its node_rank.
    """
    # Imported here, not at the top: `python -m pycyxwiz.launch` must find the launcher not yet imported.
    from ..launch import FOREIGN_RANK_VARS, _free_port, port_number

    if not callable(fn):
        raise TypeError(f"spawn: fn must be callable, got {type(fn).__name__}")
    if nprocs < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"spawn: nprocs={nprocs} and nnodes={nnodes} must be >= 1, node_rank={node_rank} in "
                         f"[0, nnodes)")
    addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if master_port:
        port = port_number("master_port", str(master_port))
    else:
        port = port_number("MASTER_PORT", os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else 0
    if not port:
        if nnodes > 1:
            raise ValueError("spawn: with nnodes > 1 every node needs the same master port: pass master_port= "
                             "or set MASTER_PORT")
        port = _free_port()
    # Every node derives the same id from the endpoint; one node gets a fresh one per call.
    job_id = hashlib.sha256(f"{addr}:{port}".encode()).hexdigest()[:16] if nnodes > 1 else secrets.token_hex(8)
    world = nnodes * nprocs
    # A fresh random secret per job on one node; several nodes cannot agree on one without talking,
    # so there the user's CYXWIZ_SECRET (the same on every node) is used as it is.
    secret = None if "CYXWIZ_SECRET" in os.environ or nnodes > 1 else secrets.token_hex(32)

    context = multiprocessing.get_context("spawn")
    results = context.SimpleQueue()
    processes = []
    saved = dict(os.environ)
    # Stops the ranks should this process be killed without a chance to (SIGKILL, the OOM killer).
    watchdog = Watchdog(_GRACE_SECONDS, f"[spawn] the process that called spawn() (pid {os.getpid()})")
    # Windows: the ranks go in a job that ends with this process or at _stop. Not this process itself
    # (as the launcher goes in its own): the caller's other children would then end with it too. So a
    # rank enters the job just after start(), while its interpreter is still starting up; only a
    # process it started before that (none: `fn` has not run yet) would be outside the job.
    job = _winjob.new_job() if os.name == "nt" else None
    try:
        for local_rank in range(nprocs):
            # A spawned interpreter inherits os.environ as it is at start(): set this rank's, then restore.
            for name in FOREIGN_RANK_VARS:
                os.environ.pop(name, None)
            os.environ.update(_rank_env(node_rank * nprocs + local_rank, local_rank, world, nprocs, node_rank,
                                        addr, port, job_id, secret))
            p = context.Process(target=_run_rank, args=(fn, local_rank, tuple(args), results),
                                name=f"pycyxwiz-rank-{local_rank}", daemon=False)
            p.start()
            processes.append(p)
            watchdog.watch(p.pid)
            if job is not None:
                job.add(p.pid)  # refused: _stop still terminates the rank itself
    except BaseException:
        _stop(processes, job)
        watchdog.close()
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        return _join(processes, results, timeout, job)
    finally:
        watchdog.close()


def _join(processes: list, results, timeout: Optional[float], job=None) -> list:
    deadline = None if timeout is None else time.monotonic() + timeout
    values: dict[int, Any] = {}
    errors: dict[int, tuple[str, bool]] = {}  # local rank: (traceback, is a DistError)
    running = {p.sentinel: (local_rank, p) for local_rank, p in enumerate(processes)}

    def ended(sentinels) -> list:
        """(local rank, exit code) of those of `sentinels` that failed; all of them leave `running`."""
        failed = []
        for sentinel in sentinels:
            local_rank, p = running.pop(sentinel)
            exit_code = wait_unreaped(p.pid, lambda p=p: (p.join(), p.exitcode)[1])
            while not results.empty():  # what it sent just before it exited
                r, ok, payload = results.get()
                (values if ok else errors)[r] = payload
            if exit_code != 0 or local_rank in errors:
                failed.append((local_rank, exit_code))
        return failed

    def consequence(failure) -> bool:
        return failure[0] in errors and errors[failure[0]][1]

    try:
        while running:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait(list(running), timeout=None if left is None else min(left, 1.0))
            while not results.empty():
                local_rank, ok, payload = results.get()
                (values if ok else errors)[local_rank] = payload
            failed = ended(ready)
            if failed:
                # The cause is a rank whose failure is not a DistError: a peer that exits makes the others
                # raise one at once (over shared memory especially), maybe before its own exit is seen.
                if all(consequence(f) for f in failed) and running:
                    failed += ended(multiprocessing.connection.wait(list(running), timeout=2.0))
                local_rank, exit_code = min(failed, key=consequence)
                raise _failure(local_rank, exit_code, errors[local_rank][0] if local_rank in errors else None)
            if deadline is not None and time.monotonic() >= deadline and running:
                still = sorted(r for r, _ in running.values())
                raise SpawnError(f"spawn: ranks {still} still running after the timeout of {timeout} s; stopped them. "
                                 f"A rank that waits on a dead or missing peer should fail by itself within "
                                 f"DISTRIBUTED_TIMEOUT_MS: raise timeout, or check what the ranks wait for")
    finally:
        _stop(processes, job)  # also after success: what the ranks started and left running
    missing = [r for r in range(len(processes)) if r not in values]
    if missing:
        raise SpawnError(f"spawn: ranks {missing} exited without returning (os._exit?)")
    return [values[r] for r in range(len(processes))]


def _failure(local_rank: int, exit_code: Optional[int], trace: Optional[str]) -> SpawnError:
    if trace:
        how = f"raised an exception:\n\n{trace}"
    elif exit_code is not None and exit_code < 0:
        how = f"was killed by signal {-exit_code}"
    else:
        how = f"exited with code {exit_code}"
    return SpawnError(f"spawn: local rank {local_rank} {how}\nthe other ranks were stopped", local_rank, exit_code)


def _stop(processes: list, job=None) -> None:
    """SIGTERM to every rank's process group (what ranks that exited left running too), SIGKILL to
    what outlives the grace period; then the same to ranks not yet in a group of their own.
    Windows: the ranks share our console process group, so no signal can reach them alone; their job
    is closed, which terminates them and what they started at once."""
    if hasattr(os, "killpg"):
        stop_groups([p.pid for p in processes], _GRACE_SECONDS)
    elif job is not None:
        job.close()
    for p in processes:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + _GRACE_SECONDS
    for p in processes:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5.0)
