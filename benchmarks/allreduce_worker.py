"""Rank-side code of benchmarks/allreduce.py: one process per rank, the same code for every library.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python benchmarks/allreduce_worker.py --backend pycyxwiz --sizes 4096,65536 --seconds 2
    mpirun -np 2 ... python benchmarks/allreduce_worker.py --backend mpi --sizes 4096 --seconds 2

The driver (benchmarks/allreduce.py) starts these processes; run by hand only to debug one library.
Its backends "pycyxwiz-tcp", "pycyxwiz-shared" and "mpi-shm" run this code as "pycyxwiz" and "mpi": only
the environment (CYXWIZ_TRANSPORT=tcp; CYXWIZ_BENCH_SHARED=1: arrays from _shared_zeros) or mpirun's
flags (--mca btl vader,self) differ.

Per size (float32, SUM, in place):
  1. one checked call: rank r fills its array with r + 1; every element must come back N(N+1)/2;
  2. the array is zeroed (so the timed calls neither overflow nor hit inf/NaN), then `--warmup` calls,
     each after a barrier; the median warm-up (barrier + call, max over ranks) sets the number of timed
     calls n = seconds / (barrier + call), clamped to [--min-iters, --max-iters], the same on every rank;
  3. n calls, each after a barrier, timed on every rank with time.perf_counter;
  4. one barrier, then n calls back to back (nccl-tests style): time per call = elapsed / n;
  5. one all-reduce MAX of all those times: a call's time is the slowest rank's.
Rank 0 prints one line `ALLREDUCE_RESULT {json}` per size. Any rank that fails prints
`ALLREDUCE_ERROR {json}` and exits with status 1. `ALLREDUCE_READY {json}` follows a successful init; its
"transport" is what carries the data: pycyxwiz's get_config().transport ("shm" or "tcp"), Open MPI's BTL list
(OMPI_MCA_btl, as mpirun passes --mca btl), "tcp" for Gloo.
"""

import argparse
import gc
import json
import os
import sys
import time
import traceback

import numpy as np

RESULT, READY, ERROR = "ALLREDUCE_RESULT", "ALLREDUCE_READY", "ALLREDUCE_ERROR"


def emit(tag, obj):
    sys.stdout.write(f"{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()


class PycyxwizComm:
    name = "pycyxwiz"

    def __init__(self):
        import pycyxwiz as cx

        self.cx = cx
        if hasattr(cx, "set_num_threads"):
            cx.set_num_threads(1)
        self.dist = cx.distributed
        self.dist.init()
        self.rank, self.size = self.dist.get_rank(), self.dist.get_world_size()
        config = self.dist.get_config()
        # "shm" or "tcp"; None from a build before the shared-memory transport (always TCP).
        self.transport = getattr(config, "transport", None)
        self.info = {"version": getattr(cx, "__version__", "?"), "backend": self.dist.get_backend(),
                     "config": repr(config), "transport": self.transport,
                     "CYXWIZ_TRANSPORT": os.environ.get("CYXWIZ_TRANSPORT"),
                     "CYXWIZ_RING_SLICE_BYTES": os.environ.get("CYXWIZ_RING_SLICE_BYTES")}

    def array(self, n):
        # pycyxwiz-shared: memory the ranks of the host map, as DDP's gradient buckets are.
        if os.environ.get("CYXWIZ_BENCH_SHARED"):
            return self.dist._shared_zeros(np.empty(n, np.float32))
        return np.empty(n, np.float32)

    def all_reduce(self, x):
        self.dist.all_reduce(x)

    def max_(self, t):
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.finalize()


class GlooComm:
    name = "gloo"

    def __init__(self, timeout_s):
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        self.torch, self.dist = torch, dist
        self.rank, self.size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", init_method="env://", rank=self.rank, world_size=self.size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.transport = "tcp"
        self.info = {"torch": torch.__version__, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME")}
        self._last = (None, None)

    def _tensor(self, x):
        # torch.from_numpy shares the array's memory, so the in-place all-reduce writes into x; the
        # view of the current array is made once, outside the timed calls' per-call cost.
        if self._last[0] is not x:
            self._last = (x, self.torch.from_numpy(x))
        return self._last[1]

    def all_reduce(self, x):
        self.dist.all_reduce(self._tensor(x), op=self.dist.ReduceOp.SUM)

    def max_(self, t):
        self.dist.all_reduce(self.torch.from_numpy(t), op=self.dist.ReduceOp.MAX)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


class MpiComm:
    name = "mpi"

    def __init__(self):
        import mpi4py
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.transport = os.environ.get("OMPI_MCA_btl")  # mpirun --mca btl X exports it to the ranks
        self.info = {"mpi4py": mpi4py.__version__, "library": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
                     "OMPI_MCA_btl": self.transport, "OMPI_MCA_pml": os.environ.get("OMPI_MCA_pml")}

    def all_reduce(self, x):
        self.comm.Allreduce(self.MPI.IN_PLACE, x, op=self.MPI.SUM)

    def max_(self, t):
        self.comm.Allreduce(self.MPI.IN_PLACE, t, op=self.MPI.MAX)

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        pass


def measure(comm, nbytes, args):
    n_el = nbytes // 4
    N, r = comm.size, comm.rank
    x = comm.array(n_el) if hasattr(comm, "array") else np.empty(n_el, np.float32)
    x.fill(r + 1)
    comm.all_reduce(x)
    expect = N * (N + 1) / 2
    bad = int(np.count_nonzero(x != expect))
    if bad:
        first = int(np.flatnonzero(x != expect)[0])
        raise RuntimeError(f"wrong result at {nbytes} bytes on rank {r}: {bad} of {n_el} elements differ from {expect} "
                           f"(first at index {first}: {x[first]})")
    x.fill(0.0)

    clock = time.perf_counter
    warm = []
    for _ in range(args.warmup):
        a = clock()
        comm.barrier()
        comm.all_reduce(x)
        warm.append(clock() - a)
    # The median warm-up (barrier + call): the first call of a job can include connection set-up.
    est = np.array([float(np.median(warm)) if warm else 1e-3], dtype=np.float64)
    comm.max_(est)
    n = int(min(args.max_iters, max(args.min_iters, round(args.seconds / max(est[0], 1e-9)))))

    times = np.empty(n + 1, dtype=np.float64)
    gc.disable()
    try:
        for i in range(n):
            comm.barrier()
            a = clock()
            comm.all_reduce(x)
            times[i] = clock() - a
        comm.barrier()
        a = clock()
        for _ in range(n):
            comm.all_reduce(x)
        times[n] = (clock() - a) / n
    finally:
        gc.enable()
    comm.max_(times)
    per_call = np.sort(times[:n])
    us = 1e6

    def pct(p):
        return float(np.percentile(per_call, p)) * us

    return {
        "bytes": nbytes, "count": n_el, "iters": n, "warmup": args.warmup, "est_call_us": float(est[0]) * us,
        "median_us": pct(50), "p10_us": pct(10), "p90_us": pct(90), "min_us": float(per_call[0]) * us,
        "max_us": float(per_call[-1]) * us, "mean_us": float(per_call.mean()) * us,
        "b2b_us": float(times[n]) * us, "check": "ok",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", required=True, choices=["pycyxwiz", "gloo", "mpi"])
    p.add_argument("--sizes", required=True, help="comma-separated byte counts (multiples of 4)")
    p.add_argument("--seconds", type=float, default=2.0, help="time to fill with timed calls per size and mode")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-iters", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--init-timeout", type=float, default=120.0, help="Gloo's process-group timeout (s)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "?"
    stage = "init"
    comm = None
    try:
        t0 = time.perf_counter()
        if args.backend == "pycyxwiz":
            comm = PycyxwizComm()
        elif args.backend == "gloo":
            comm = GlooComm(args.init_timeout)
        else:
            comm = MpiComm()
        rank = comm.rank
        if comm.rank == 0:
            emit(READY, {"backend": comm.name, "world_size": comm.size, "init_s": time.perf_counter() - t0,
                         "pid": os.getpid(), "transport": comm.transport, "info": comm.info})
        for nbytes in sizes:
            stage = f"size {nbytes}"
            res = measure(comm, nbytes, args)
            if comm.rank == 0:
                res.update(backend=comm.name, world_size=comm.size)
                emit(RESULT, res)
        stage = "finalize"
        comm.close()
    except BaseException as e:  # noqa: BLE001 - report anything, including KeyboardInterrupt
        emit(ERROR, {"rank": rank, "stage": stage, "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()[-3000:]})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no atexit handlers: a failed rank must not block in finalize


if __name__ == "__main__":
    main()
