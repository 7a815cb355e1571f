"""Rank-side code of benchmarks/train_throughput.py: one process per rank, one framework per job.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python benchmarks/train_throughput_worker.py --framework pycyxwiz --model small --modes ddp,sharded,nocomm

The driver (benchmarks/train_throughput.py) starts these processes; run by hand only to debug.

Each rank generates its own synthetic data once (float32 randn(rows, 784), randint(0, 10) labels, seeded by
(seed, rank)) and builds one model per mode:
  ddp      pycyxwiz: out = ddp.forward(x); ddp.backward(loss.backward(out, y)); ddp.update_parameters(opt)
                     (DDPConfig.shard_optimizer = False)
           torch:    opt.zero_grad(set_to_none=True); F.cross_entropy(ddp(x), y).backward(); opt.step()
  sharded  the optimizer step sharded across the ranks (ZeRO stage 1: each rank updates 1/N of the parameters
           and keeps the optimizer state for them only, the parameters are all-gathered after the update):
           pycyxwiz: the ddp step with DDPConfig.shard_optimizer = True (gradients reduce-scattered)
           torch:    the ddp loop with torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=Adam,
                     the same Adam arguments as ddp) instead of Adam (gradients all-reduced by DDP, the
                     updated parameters broadcast by their owners); when it cannot be constructed the mode is
                     skipped (reported in TRAIN_READY/TRAIN_RESULT "skipped"; the ranks agree on it)
  bf16     the ddp step with gradients exchanged in bfloat16: pycyxwiz DDPConfig.gradient_dtype = "bfloat16";
           torch DDP with bf16_compress_hook's body (default_hooks._compress_hook(torch.bfloat16): the public
           hook refuses anything but CUDA/XPU) as its comm hook
  bf16-sharded
           pycyxwiz only: sharded with DDPConfig.gradient_dtype = "bfloat16"
  unfused, sharded-unfused, bf16-unfused
           pycyxwiz only: ddp, sharded and bf16 wrapped with CYXWIZ_DDP_FUSED_STEP=0 (each bucket all-reduced or
           reduce-scattered, then stepped on: no fused optimizer step)
  nocomm   the same model without any gradient communication (the compute-only ceiling of N busy ranks):
           pycyxwiz: model.forward, model.backward(loss.backward(...)), opt.step(model), model.zero_grad()
           torch:    the loop above on the plain (unwrapped) model
CYXWIZ_DDP_SHARD_OPTIMIZER is removed from the environment before any model is wrapped, so that it cannot
shard the ddp mode; each wrapped model's ddp.shard_optimizer is checked against its mode.
All modes live in one process and their rounds alternate (ddp, sharded, nocomm, ddp, ...), so background load
hits them alike. A round: a barrier (the only collective outside the training step), `warmup` untimed steps, then
`steps` steps timed one by one with time.perf_counter in a loop without barriers, the GC off. Each step
draws 64 random row indices and gathers X[idx], y[idx] outside the timed region.

Every rank prints `TRAIN_ROUND {json}` after each round and `TRAIN_RESULT {json}` (all its step times) at
the end; `TRAIN_READY {json}` after set-up; `TRAIN_ERROR {json}` and exit status 1 on any failure.
"""

import argparse
import gc
import json
import os
import resource
import sys
import time
import traceback

import numpy as np

from mlp import LR, MODELS, build_cx, torch_mlp  # the MLP every benchmark trains; imports neither framework

READY, ROUND, RESULT, ERROR = "TRAIN_READY", "TRAIN_ROUND", "TRAIN_RESULT", "TRAIN_ERROR"
BATCH = 64
CLASSES = 10
MODES = ("ddp", "unfused", "sharded", "sharded-unfused", "bf16", "bf16-unfused", "bf16-sharded", "nocomm")
SHARD_ENV = "CYXWIZ_DDP_SHARD_OPTIMIZER"


class Skip(Exception):
    """A mode this framework cannot run here (not a failure): the reason is reported and the mode left out."""


def emit(tag, obj):
    sys.stdout.write(f"{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()


def thread_count():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def checksum(arrays):
    """float64 sums of every parameter: equal on every rank when the replicas are in sync."""
    return [float(np.asarray(a, dtype=np.float64).sum()) for a in arrays]


class Cyxwiz:
    name = "pycyxwiz"

    def __init__(self, args):
        import pycyxwiz as cx

        self.cx, self.dist = cx, cx.distributed
        cx.set_num_threads(1)
        self.dist.init()
        self.rank, self.world = self.dist.get_rank(), self.dist.get_world_size()
        self.info = {"version": getattr(cx, "__version__", "?"), "threads": cx.get_num_threads()}
        if os.environ.pop(SHARD_ENV, None) is not None:  # it would shard the ddp mode too (OR-ed with the config)
            self.info["removed_env"] = SHARD_ENV
        try:
            b = cx.build_info()
            self.info["blas"] = b.get("blas")
            self.info["blas_threads"] = b.get("blas_threads")
        except Exception:  # noqa: BLE001 - informational only
            pass

    def build(self, sizes, mode, seed):
        m, lossfn, opt = build_cx(self.cx, sizes, seed)
        if mode in ("ddp", "unfused", "sharded", "sharded-unfused", "bf16", "bf16-unfused", "bf16-sharded"):
            shard = mode.startswith("sharded") or mode.endswith("-sharded")
            cfg = self.dist.DDPConfig()
            if mode.startswith("bf16"):
                if not hasattr(cfg, "gradient_dtype"):
                    raise Skip("this pycyxwiz has no DDPConfig.gradient_dtype")
                cfg.gradient_dtype = "bfloat16"
            if not hasattr(cfg, "shard_optimizer"):
                if shard:
                    raise Skip("this pycyxwiz has no DDPConfig.shard_optimizer")
            else:
                cfg.shard_optimizer = shard  # explicitly, for ddp too
            unfused = mode.endswith("unfused")
            if unfused:
                os.environ["CYXWIZ_DDP_FUSED_STEP"] = "0"  # read when the model is wrapped
            try:
                ddp = self.dist.DistributedDataParallel(m, cfg)
            finally:
                if unfused:
                    os.environ.pop("CYXWIZ_DDP_FUSED_STEP", None)
            got = getattr(ddp, "shard_optimizer", False)
            if got != shard:
                raise RuntimeError(f"mode {mode}: DistributedDataParallel.shard_optimizer is {got}, expected {shard}")
            key = "buckets_sharded" if shard else "buckets"
            try:
                self.info[key] = [list(b) for b in ddp.bucket_sizes()]
            except Exception as e:  # noqa: BLE001 - informational only
                self.info[key] = f"bucket_sizes() failed: {type(e).__name__}: {e}"

            def step(xb, yb):
                out = ddp.forward(xb)
                ddp.backward(lossfn.backward(out, yb))
                ddp.update_parameters(opt)

            params = ddp.parameters
        else:
            def step(xb, yb):
                out = m.forward(xb)
                m.backward(lossfn.backward(out, yb))
                opt.step(m)
                m.zero_grad()

            params = m.parameters
        return step, params, m.num_parameters()

    def agree(self, skipped, modes):
        """pycyxwiz skips only on a missing attribute, the same on every rank: nothing to agree on."""
        return skipped

    def batch(self, X, y, idx):
        return X[idx], y[idx]

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.finalize()


class Torch:
    name = "torch"

    def __init__(self, args):
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        self.torch, self.dist, self.adam = torch, dist, args.torch_adam
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", init_method="env://", rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=args.init_timeout))
        self.info = {"version": torch.__version__, "threads": torch.get_num_threads(), "adam": args.torch_adam,
                     "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME")}

    def build(self, sizes, mode, seed):
        torch = self.torch
        F = torch.nn.functional
        torch.manual_seed(seed)
        model = torch_mlp(torch, sizes)
        if mode.endswith("unfused"):
            raise Skip("pycyxwiz's fused optimizer step has no torch counterpart")
        net = torch.nn.parallel.DistributedDataParallel(model) if mode in ("ddp", "sharded", "bf16") else model
        if mode == "bf16":
            try:
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                # bf16_compress_hook is _compress_hook(torch.bfloat16, ...) behind a check that refuses
                # anything but CUDA/XPU; its body runs on Gloo as it is.
                def bf16_compress_hook_on_cpu(state, bucket):
                    return default_hooks._compress_hook(torch.bfloat16, state, bucket)

                net.register_comm_hook(None, bf16_compress_hook_on_cpu)
            except Exception as e:  # noqa: BLE001 - any reason it cannot be registered: the mode is skipped
                raise Skip(f"register_comm_hook(_compress_hook(torch.bfloat16)) failed: {type(e).__name__}: {e}") from e
        adam = {"lr": LR, "fused": True} if self.adam == "fused" else {"lr": LR}  # else the per-tensor CPU loop
        if mode == "sharded":
            try:
                from torch.distributed.optim import ZeroRedundancyOptimizer

                opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, **adam)
            except Exception as e:  # noqa: BLE001 - any reason it cannot be built: the mode is skipped
                raise Skip(f"ZeroRedundancyOptimizer(optimizer_class=torch.optim.Adam, "
                           f"{', '.join(f'{k}={v}' for k, v in adam.items())}) failed: {type(e).__name__}: {e}") from e
        else:
            opt = torch.optim.Adam(net.parameters(), **adam)

        def step(xb, yb):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(xb), yb).backward()
            opt.step()

        def params():
            return [p.detach().numpy() for p in model.parameters()]

        return step, params, sum(p.numel() for p in model.parameters())

    def agree(self, skipped, modes):
        """A mode skipped on any rank is skipped on all (a rank alone in a round's collectives would hang)."""
        every = [None] * self.world
        self.dist.all_gather_object(every, skipped)
        out = dict(skipped)
        for r, theirs in enumerate(every):
            for m, why in theirs.items():
                out.setdefault(m, f"on rank {r}: {why}")
        return out

    def batch(self, X, y, idx):
        return self.torch.from_numpy(X[idx]), self.torch.from_numpy(y[idx])  # zero-copy views of the gathers

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


def run_round(fw, step, X, y, rng, warmup, steps):
    """Barrier, warm-up, then `steps` steps timed one by one (no barrier inside). Returns (times, cpu_s)."""
    fw.barrier()
    for _ in range(warmup):
        step(*fw.batch(X, y, rng.integers(0, len(X), BATCH)))
    gc.collect()
    gc.disable()
    times = np.empty(steps, dtype=np.float64)
    pc = time.perf_counter
    try:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = pc()
        for i in range(steps):
            xb, yb = fw.batch(X, y, rng.integers(0, len(X), BATCH))
            t0 = pc()
            step(xb, yb)
            times[i] = pc() - t0
        wall = pc() - w0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        gc.enable()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)  # every thread of the process
    return times, cpu, wall


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", required=True, choices=["pycyxwiz", "torch"])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--modes", default="ddp,sharded,nocomm",
                   help="comma-separated, in round order: ddp, sharded, nocomm")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-adam", choices=["fused", "default"], default="fused")
    p.add_argument("--init-timeout", type=float, default=300.0, help="torch process-group timeout (s)")
    args = p.parse_args()
    modes = list(dict.fromkeys(m for m in args.modes.split(",") if m))
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}")

    rank = os.environ.get("RANK", "?")
    stage = "init"
    try:
        t0 = time.perf_counter()
        fw = Cyxwiz(args) if args.framework == "pycyxwiz" else Torch(args)
        rank = fw.rank
        stage = "data"
        rng = np.random.default_rng([args.seed, fw.rank])
        X = rng.standard_normal((args.rows, MODELS[args.model][0]), dtype=np.float32)
        y = rng.integers(0, CLASSES, args.rows).astype(np.int64)
        steps, params, skipped = {}, {}, {}
        nparams = None
        for m in modes:
            stage = f"build {m}"
            # Same seed on every rank: DDP starts from equal replicas anyway (rank 0's are broadcast).
            try:
                steps[m], params[m], nparams = fw.build(MODELS[args.model], m, args.seed)
            except Skip as e:
                skipped[m] = str(e)
        stage = "agree on skipped modes"
        skipped = fw.agree(skipped, modes)
        modes = [m for m in modes if m not in skipped]
        if not modes:
            raise RuntimeError(f"every mode was skipped: {skipped}")
        emit(READY, {"rank": fw.rank, "framework": fw.name, "world_size": fw.world, "model": args.model,
                     "modes": modes, "skipped": skipped, "params": int(nparams), "setup_s": time.perf_counter() - t0,
                     "pid": os.getpid(), "threads": thread_count(), "info": fw.info})
        times = {m: [] for m in modes}
        cpu = {m: [] for m in modes}
        wall = {m: [] for m in modes}
        batch_rng = {m: np.random.default_rng([args.seed, fw.rank, 1]) for m in modes}  # same indices for each mode
        for r in range(args.rounds):
            for m in modes:
                stage = f"round {r + 1} {m}"
                t, c, w = run_round(fw, steps[m], X, y, batch_rng[m], args.warmup, args.steps)
                times[m].append(t.tolist())
                cpu[m].append(c)
                wall[m].append(w)
                emit(ROUND, {"rank": fw.rank, "round": r, "mode": m, "median_ms": float(np.median(t)) * 1e3,
                             "cpu_per_wall": c / w if w > 0 else None})
        stage = "checksum"
        sums = {m: checksum(params[m]()) for m in modes}
        emit(RESULT, {"rank": fw.rank, "framework": fw.name, "world_size": fw.world, "model": args.model,
                      "times_s": times, "cpu_s": cpu, "wall_s": wall, "threads": thread_count(), "checksums": sums,
                      "skipped": skipped})
        stage = "finalize"
        fw.close()
    except BaseException as e:  # noqa: BLE001 - report anything, including KeyboardInterrupt
        emit(ERROR, {"rank": rank, "stage": stage, "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()[-3000:]})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no atexit handlers: a failed rank must not block in finalize


if __name__ == "__main__":
    main()
