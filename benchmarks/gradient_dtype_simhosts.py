"""DDP training steps across two simulated hosts with gradients exchanged in float32, bfloat16 and float16.

    sudo python benchmarks/gradient_dtype_simhosts.py               # 2 hosts x 2 ranks, 1gbit, the 20M model, + digits
    python benchmarks/gradient_dtype_simhosts.py --quick            # smoke run (< 60 s): the small model, few steps
    python benchmarks/gradient_dtype_simhosts.py --transport tcp --dtypes float32 bfloat16 --no-digits

Issue 27's cross-host target for DDPConfig.gradient_dtype: over the 1 Gbit/s link, link bytes half of
float32's and the step at most 0.6x; the trained model within float rounding of float32's accuracy.

Two hosts (tests/simhosts.py: each a network, IPC and mount namespace with its own /dev/shm) joined by a
veth pair shaped by tbf on both ends (--rate, "none" unshaped). Part 1, timing: 2 x --ranks-per-host ranks
(rank r on host r // L, MASTER_ADDR on host A), the default transport (hierarchical shm+tcp when every
host has 2 or more ranks) or --transport tcp (the flat ring). One job: every rank builds one model per
gradient dtype (--dtypes) plus a plain one (no-comm), all from the same seed (benchmarks/mlp.py's
build_cx: Linear/ReLU MLP, CrossEntropyLoss, AdamOptimizer(1e-3)), and the modes take turns in rounds
inside the same processes (the order rotating each round), so background load hits them alike:
  DDP      out = ddp.forward(x); ddp.backward(loss.backward(out, y)); ddp.update_parameters(opt)
           (DDPConfig.gradient_dtype = dtype, everything else default)
  no-comm  out = model.forward(x); model.backward(loss.backward(out, y)); opt.step(model); model.zero_grad()
A round: barrier, --warmup untimed steps, barrier, then --steps steps timed one by one (time.perf_counter,
GC off, no collective inside the loop), barrier. Each rank draws its own random data (randn(4096, 784),
randint(0, 10), seeded by rank) and batches of 64 by random index outside the timed region. A step's time is
the slowest rank's: one all_reduce(MAX) of every rank's per-step times after the last round. Link bytes:
the rank of local index 0 on each host reads its veth's tx bytes (/proc/net/dev in its network namespace)
between the barriers around the timed steps; both hosts summed, per step: frames with their headers, both
directions. The link bound is the time those bytes take at the rate, half in each direction. At the end
every rank all_gathers a checksum (float64 sum and crc32 of every parameter) of each DDP model: it must be
the same on every rank.

Part 2, accuracy (--digits, on by default): scikit-learn's load_digits (1797 8x8 images, 64 features,
standardised with the training part's mean and std; 25% of the rows as the test set, for each of
--digits-splits: "shuffled", a fixed stratified train_test_split(random_state=0), and "last", the last 25%
of the rows, which come from other writers and are harder: float32 itself stays near 92% there), 2 hosts x
--digits-ranks-per-host ranks (default 1: 2 ranks over the link), a 64-128-10 MLP, Adam(1e-3), batch 32
per rank (global batches of a permutation per epoch, seeded), --digits-steps steps, once per gradient
dtype from the same seed and the same batches. Reported: test accuracy, the loss (mean over ranks) per
step and its largest relative difference to the float32 exchange's, over the first 200 steps and all.

Every process runs with CYXWIZ_NUM_THREADS=1 and cx.set_num_threads(1), the CYXWIZ_*/DISTRIBUTED_*/RANK...
variables of the caller removed, a job secret, DISTRIBUTED_TIMEOUT_MS=120000 and a hard timeout per job;
every process in the hosts is killed at the end of each job and the hosts removed. Needs root, iproute2
and util-linux. Run it on an otherwise idle machine.
"""

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from simhost_jobs import load_simhosts, log, rate_bytes_per_s, run_job, tx_bytes  # noqa: E402

READY, RESULT, ERROR = "GDTYPE_READY", "GDTYPE_RESULT", "GDTYPE_ERROR"
DTYPES = ("float32", "bfloat16", "float16")
BATCH, CLASSES, ROWS = 64, 10, 4096
DIGITS_SIZES, DIGITS_BATCH = [64, 128, 10], 32


def emit(tag, obj):
    sys.stdout.write(f"{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()


# ----------------------------------------------------------------- rank side

def param_checksum(arrays):
    """Per parameter: float64 sum and crc32 of its bytes (exact in float64): equal on every rank when in sync."""
    import numpy as np

    out = []
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.float32)
        out += [float(a.astype(np.float64).sum()), float(zlib.crc32(a.tobytes()))]
    return np.array(out, dtype=np.float64)


def same_on_every_rank(D, arrays):
    import numpy as np

    gathered = D.all_gather(param_checksum(arrays))
    return all(np.array_equal(g, gathered[0]) for g in gathered)


def ddp_config(D, dtype):
    cfg = D.DDPConfig()
    cfg.gradient_dtype = dtype
    return cfg


def worker_train(args):
    import numpy as np

    import pycyxwiz as cx
    from mlp import MODELS, build_cx

    cx.set_num_threads(1)
    D = cx.distributed
    D.init()
    rank, world = D.get_rank(), D.get_world_size()
    counts = os.environ.get("SIMHOST_LOCAL") == "0"  # this rank reads its host's link counter
    dev = os.environ["SIMHOST_VETH"]
    sizes = MODELS[args.model]

    rng = np.random.default_rng([args.seed, rank])
    X = rng.standard_normal((ROWS, sizes[0]), dtype=np.float32)
    y = rng.integers(0, CLASSES, ROWS).astype(np.int64)

    modes = list(args.dtypes) + ["nocomm"]
    steps, params, info = {}, {}, {}
    nparams = None
    for mode in modes:
        m, lossfn, opt = build_cx(cx, sizes, args.seed)
        nparams = m.num_parameters()
        if mode == "nocomm":
            def step(xb, yb, m=m, lossfn=lossfn, opt=opt):
                out = m.forward(xb)
                m.backward(lossfn.backward(out, yb))
                opt.step(m)
                m.zero_grad()
            params[mode] = m.parameters
        else:
            ddp = D.DistributedDataParallel(m, ddp_config(D, mode))

            def step(xb, yb, ddp=ddp, lossfn=lossfn, opt=opt):
                out = ddp.forward(xb)
                ddp.backward(lossfn.backward(out, yb))
                ddp.update_parameters(opt)
            params[mode] = ddp.parameters
            info[mode] = {"overlap": bool(ddp.overlap), "shard_optimizer": bool(ddp.shard_optimizer),
                          "buckets": [list(b) for b in ddp.bucket_sizes()]}
        steps[mode] = step
    if rank == 0:
        emit(READY, {"transport": D.get_config().transport, "world_size": world, "params": int(nparams),
                     "ddp": info, "threads": cx.get_num_threads()})

    times = np.zeros((len(modes), args.rounds, args.steps), dtype=np.float64)
    sent = np.zeros((len(modes), args.rounds), dtype=np.float64)
    batch_rng = {m: np.random.default_rng([args.seed, rank, 1]) for m in modes}  # same batches for each mode
    pc = time.perf_counter
    for r in range(args.rounds):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            i, step, brng = modes.index(mode), steps[mode], batch_rng[mode]
            D.barrier()
            for _ in range(args.warmup):
                idx = brng.integers(0, ROWS, BATCH)
                step(X[idx], y[idx])
            gc.collect()
            D.barrier()
            before = tx_bytes(dev) if counts else 0
            gc.disable()
            try:
                for s in range(args.steps):
                    idx = brng.integers(0, ROWS, BATCH)
                    xb, yb = X[idx], y[idx]
                    t0 = pc()
                    step(xb, yb)
                    times[i, r, s] = pc() - t0
            finally:
                gc.enable()
            D.barrier()  # every byte of the timed steps has crossed
            sent[i, r] = tx_bytes(dev) - before if counts else 0
        if rank == 0:
            log(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{m} {np.median(times[modes.index(m), r]) * 1e3:.0f} ms" for m in modes) + " (rank 0)")
    D.all_reduce(times, op=D.ReduceOp.MAX)  # the slowest rank per step
    D.all_reduce(sent)                      # both hosts' counters (the other ranks add 0)
    identical = {m: bool(same_on_every_rank(D, params[m]())) for m in args.dtypes}
    if rank == 0:
        emit(RESULT, {"modes": modes, "times_s": times.tolist(), "link_bytes": sent.tolist(), "identical": identical})
    D.finalize()


def digits_data(split):
    """(Xtr, ytr, Xte, yte) of load_digits, standardised by the training rows' mean and std. split "last": the
    last 25% of the rows are the test set; "shuffled": train_test_split(test_size=0.25, stratify=y,
    random_state=0), a fixed shuffled split."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    X, y = d.data.astype(np.float32), d.target.astype(np.int64)
    if split == "last":
        n_test = len(X) // 4
        Xtr, ytr, Xte, yte = X[:-n_test], y[:-n_test], X[-n_test:], y[-n_test:]
    else:
        from sklearn.model_selection import train_test_split

        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0
    return (Xtr - mu) / sd, ytr, (Xte - mu) / sd, yte


def worker_digits(args):
    import numpy as np

    import pycyxwiz as cx
    from mlp import build_cx

    cx.set_num_threads(1)
    D = cx.distributed
    D.init()
    rank, world = D.get_rank(), D.get_world_size()
    g = DIGITS_BATCH * world
    out = {}
    for split in args.digits_splits:
        Xtr, ytr, Xte, yte = digits_data(split)
        per_epoch = len(Xtr) // g  # full global batches only
        res = {"train": len(Xtr), "test": len(Xte), "steps_per_epoch": per_epoch, "dtypes": {}}
        for dtype in args.dtypes:
            m, lossfn, opt = build_cx(cx, DIGITS_SIZES, args.seed)
            ddp = D.DistributedDataParallel(m, ddp_config(D, dtype))
            losses = np.zeros(args.digits_steps, dtype=np.float64)
            perm = None
            for s in range(args.digits_steps):
                e, b = divmod(s, per_epoch)
                if b == 0:
                    perm = np.random.default_rng([args.seed, 7, e]).permutation(len(Xtr))
                idx = perm[b * g + rank * DIGITS_BATCH:b * g + (rank + 1) * DIGITS_BATCH]
                xb, yb = Xtr[idx], ytr[idx]
                o = ddp.forward(xb)
                losses[s] = float(lossfn.forward(o, yb))
                ddp.backward(lossfn.backward(o, yb))
                ddp.update_parameters(opt)
            D.all_reduce(losses, op=D.ReduceOp.AVG)  # the global batch's loss per step
            acc = float((np.asarray(m.forward(Xte)).argmax(1) == yte).mean())
            train_acc = float((np.asarray(m.forward(Xtr)).argmax(1) == ytr).mean())
            res["dtypes"][dtype] = {"test_accuracy": acc, "train_accuracy": train_acc, "losses": losses.tolist(),
                                    "identical": bool(same_on_every_rank(D, ddp.parameters()))}
        out[split] = res
    if rank == 0:
        emit(READY, {"transport": D.get_config().transport, "world_size": world})
        emit(RESULT, out)
    D.finalize()


def worker(args):
    try:
        (worker_digits if args.worker == "digits" else worker_train)(args)
    except BaseException as e:  # noqa: BLE001 - report anything
        emit(ERROR, {"rank": os.environ.get("RANK"), "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()[-3000:]})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no atexit handlers: a failed rank must not block in finalize


# ----------------------------------------------------------------- driver

def job(hosts, ranks_per_host, worker_argv, transport, port, timeout, what, env=None):
    """One job of 2 x `ranks_per_host` ranks: (READY record, RESULT record) of rank 0, or raises."""
    argv = [sys.executable, os.path.abspath(__file__), *worker_argv]
    out, err = run_job(hosts, ranks_per_host, argv, port, secret="gradient-dtype-benchmark", timeout=timeout,
                       what=what, transport=transport, error_tag=ERROR, env=env)
    for ln in err.splitlines()[-40:]:  # rank 0's log lines (round progress)
        log(f"  [rank 0] {ln}")
    lines = out.splitlines()
    ready = [json.loads(ln[len(READY) + 1:]) for ln in lines if ln.startswith(READY + " ")]
    result = [json.loads(ln[len(RESULT) + 1:]) for ln in lines if ln.startswith(RESULT + " ")]
    if not ready or not result:
        raise RuntimeError(f"{what}: rank 0 printed no {READY if not ready else RESULT} line")
    return ready[0], result[0]


def fmt_ms(s):
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def summarise_train(ready, result, args):
    import numpy as np

    modes = result["modes"]
    times = np.array(result["times_s"])      # [mode, round, step], slowest rank
    sent = np.array(result["link_bytes"])    # [mode, round], both hosts
    rec = {}
    for i, m in enumerate(modes):
        t = times[i].ravel()
        rec[m] = {"median_s": float(np.median(t)), "p90_s": float(np.percentile(t, 90)),
                  "round_medians_s": [float(np.median(times[i, r])) for r in range(times.shape[1])],
                  "link_bytes_per_step": float(sent[i].sum() / times[i].size),
                  "link_bytes_per_step_per_round": [float(b / args.steps) for b in sent[i]]}
    for m in args.dtypes:
        rec[m]["identical_on_every_rank"] = result["identical"][m]
    return rec


def markdown(machine, args, command, train, digits):
    from allreduce_report import md_table

    rate = rate_bytes_per_s(args.rate)
    out = ["# 16-bit gradient exchange across 2 simulated hosts (benchmarks/gradient_dtype_simhosts.py)", "",
           f"{machine.get('cpu', '?')}, {machine.get('cpus_usable', '?')} cores, {machine.get('mem_gib', '?')} GiB; "
           f"{machine.get('date_utc', '')}; git {machine.get('git', '?')}; load average at start "
           f"{' '.join(map(str, machine.get('load_start', [])))}, at end {' '.join(map(str, machine.get('load_end', [])))}.",
           "", f"Command: `{command}`", ""]
    if train:
        ready, rec = train["ready"], train["records"]
        f32 = rec.get("float32")
        noc = rec["nocomm"]
        ddp0 = next(iter(ready["ddp"].values()))
        nb = len(ddp0["buckets"])
        out += [f"## Step time and link bytes: 2 hosts x {args.ranks_per_host} ranks, transport {ready['transport']}, "
                f"link {args.rate}", "",
                f"Model {'-'.join(map(str, train['sizes']))} ({ready['params']:,} parameters, "
                f"{ready['params'] * 4 / 1e6:.1f} MB of float32 gradients), batch {BATCH} per rank, Adam(1e-3); "
                f"{args.rounds} rounds x {args.steps} timed steps ({args.warmup} warm-up) per mode, modes alternating "
                f"in the same processes; DDP defaults otherwise (bucket_size_mb 25: {nb} buckets, overlap "
                f"{ddp0['overlap']}). Step: median and p90 over all timed steps of the slowest rank's time; link: "
                f"tx bytes of both hosts' veths per step (frames with headers, both directions); link bound: those "
                f"bytes at {args.rate}, half in each direction.", ""]
        rows = []
        for m in list(args.dtypes) + ["nocomm"]:
            r = rec[m]
            ddp = m != "nocomm"
            rows.append([m if ddp else "no-comm (no DDP)", fmt_ms(r["median_s"]), fmt_ms(r["p90_s"]),
                         fmt_ms(noc["median_s"]) if ddp else "—",
                         f"{r['median_s'] / noc['median_s']:.2f}" if ddp else "1.00",
                         f"{r['median_s'] / f32['median_s']:.2f}" if f32 and ddp else "—",
                         f"{r['link_bytes_per_step'] / 1e6:.2f}",
                         f"{r['link_bytes_per_step'] / f32['link_bytes_per_step']:.3f}" if f32 and ddp else "—",
                         fmt_ms(r["link_bytes_per_step"] / 2 / rate) if rate and ddp else "—"])
        out += [md_table(["gradient dtype", "step median ms", "step p90 ms", "no-comm ms", "step / no-comm",
                          "step / float32 step", "link MB per step", "link bytes / float32's", "link bound ms"], rows), ""]
        ident = {m: rec[m]["identical_on_every_rank"] for m in args.dtypes}
        out.append("Parameters identical on every rank at the end (all_gather of a float64 sum and a crc32 per "
                   "parameter): " + ", ".join(f"{m} {'yes' if v else 'NO'}" for m, v in ident.items()) + ".")
        out.append("")
        out.append("Round medians (ms, slowest rank): " + "; ".join(
            f"{m} " + " ".join(f"{x * 1e3:.0f}" for x in rec[m]["round_medians_s"]) for m in list(args.dtypes) + ["nocomm"]) + ".")
        out.append("")
        if f32:
            for m in args.dtypes:
                if m == "float32":
                    continue
                b = rec[m]["link_bytes_per_step"] / f32["link_bytes_per_step"]
                t = rec[m]["median_s"] / f32["median_s"]
                out.append(f"- {m}: link bytes {b:.3f}x float32's (target 0.5: {'met' if b <= 0.505 else 'missed'}), "
                           f"step {t:.2f}x float32's (target <= 0.6: {'met' if t <= 0.6 else 'missed'}).")
            out.append("")
    if digits:
        import numpy as np

        ready = digits["ready"]
        first = next(iter(digits["result"].values()))
        out += [f"## Accuracy on digits: 2 hosts x {args.digits_ranks_per_host} rank{'s' if args.digits_ranks_per_host > 1 else ''} "
                f"({ready['world_size']} ranks, transport {ready['transport']}), link {args.rate}", "",
                f"scikit-learn load_digits (1797 rows), standardised by the training rows; test set: 25% of the rows, "
                f"either the last 25% (\"last\") or a fixed stratified shuffle (\"shuffled\": train_test_split("
                f"test_size=0.25, stratify=y, random_state=0)); MLP {'-'.join(map(str, DIGITS_SIZES))}, Adam(1e-3), "
                f"batch {DIGITS_BATCH} per rank, {args.digits_steps} steps ({args.digits_steps / first['steps_per_epoch']:.1f} "
                f"epochs), seed {args.seed}, the same initial weights and batches for every dtype. Loss: the global "
                f"batch's (mean over ranks) per step; gap: the largest |loss - float32's| / float32's over the steps.", ""]
        rows, notes = [], []
        for split, res in digits["result"].items():
            d = res["dtypes"]
            ref = d.get("float32")
            for m in args.dtypes:
                r = d[m]
                gaps = ["—", "—"]
                if ref and m != "float32":
                    rel = np.abs(np.array(r["losses"]) - np.array(ref["losses"])) / np.array(ref["losses"])
                    gaps = [f"{rel[:200].max():.3%}", f"{rel.max():.3%}"]
                    acc, n = r["test_accuracy"], res["test"]
                    notes.append(f"- {split}, {m}: test accuracy {acc:.2%} ({acc * n:.0f}/{n}; float32 "
                                 f"{ref['test_accuracy'] * n:.0f}/{n}), >= 95%: {'met' if acc >= 0.95 else 'missed'}; "
                                 f"loss within 2% of float32's over the first 200 steps: "
                                 f"{'met' if rel[:200].max() <= 0.02 else 'missed'} ({rel[:200].max():.3%}).")
                rows.append([split, m, f"{r['test_accuracy']:.2%}", f"{r['train_accuracy']:.2%}", f"{r['losses'][-1]:.4f}",
                             *gaps, "yes" if r["identical"] else "NO"])
        out += [md_table(["test split", "gradient dtype", "test accuracy", "train accuracy", "last step loss",
                          "loss gap to float32, first 200 steps", "loss gap, all steps", "identical on every rank"], rows),
                "", *notes, ""]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["train", "digits"], help=argparse.SUPPRESS)
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--transport", choices=["auto", "tcp"], default="auto",
                   help="auto: the default (hierarchical shm+tcp with 2+ ranks per host); tcp: the flat ring")
    p.add_argument("--overlap", choices=["auto", "on", "off"], default="auto",
                   help="DDP's overlap in the training job (CYXWIZ_DDP_OVERLAP): auto (the default policy: off when "
                        "the ranks have under 2 cores each, as here), on or off")
    p.add_argument("--rate", default="1gbit", help='tbf rate on both ends of the link; "none": unshaped')
    p.add_argument("--model", default="large", choices=["small", "large"], help="benchmarks/mlp.py's MODELS")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=15, help="timed steps per mode and round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", action=argparse.BooleanOptionalAction, default=True, help="part 2 (accuracy)")
    p.add_argument("--digits-ranks-per-host", type=int, default=1)
    p.add_argument("--digits-steps", type=int, default=300)
    p.add_argument("--digits-splits", nargs="+", default=["shuffled", "last"], choices=["shuffled", "last"])
    p.add_argument("--no-train", dest="train", action="store_false", help="skip part 1 (timing)")
    p.add_argument("--job-timeout", type=float, default=900, help="seconds per job before every rank is killed")
    p.add_argument("--quick", action="store_true", help="the small model, 2 rounds x 5 steps: a smoke run")
    p.add_argument("--md", help="markdown report (default results/gradient_dtype_simhosts_2core.md; "
                                "with --quick none unless given)")
    p.add_argument("--json")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(os.path.abspath(__file__), os.getcwd()), *sys.argv[1:]])
    if args.md is None and not args.quick:
        args.md = os.path.join(HERE, "results", "gradient_dtype_simhosts_2core.md")
    if args.quick:
        args.model, args.rounds, args.steps, args.warmup = "small", 2, 5, 1
        args.job_timeout = min(args.job_timeout, 120)
    if "float32" in args.dtypes:  # the reference first
        args.dtypes = ["float32"] + [d for d in args.dtypes if d != "float32"]
    args.dtypes = list(dict.fromkeys(args.dtypes))

    from allreduce import machine_info
    from mlp import MODELS

    SimHosts, Unavailable = load_simhosts()
    machine = machine_info()
    rc, dirty = 0, ""
    try:
        dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - informational only
        pass
    if dirty:
        machine["git"] = machine.get("git", "?") + " + uncommitted changes"
    train = digits = None
    port = 29600 + os.getpid() % 1000
    t_all = time.monotonic()
    try:
        with SimHosts(n=2, rate=None if args.rate == "none" else args.rate) as hosts:
            if args.train:
                t0 = time.monotonic()
                wargv = ["--worker", "train", "--model", args.model, "--dtypes", *args.dtypes, "--rounds", str(args.rounds),
                         "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
                overlap = {"auto": {}, "on": {"CYXWIZ_DDP_OVERLAP": "1"}, "off": {"CYXWIZ_DDP_OVERLAP": "0"}}[args.overlap]
                ready, result = job(hosts, args.ranks_per_host, wargv, args.transport, port, args.job_timeout,
                                    f"training job (2x{args.ranks_per_host})", env=overlap)
                port += 1
                train = {"ready": ready, "sizes": MODELS[args.model], "records": summarise_train(ready, result, args)}
                log(f"training job: {time.monotonic() - t0:.0f} s")
            if args.digits:
                t0 = time.monotonic()
                wargv = ["--worker", "digits", "--dtypes", *args.dtypes, "--digits-steps", str(args.digits_steps),
                         "--digits-splits", *args.digits_splits,
                         "--seed", str(args.seed)]
                ready, result = job(hosts, args.digits_ranks_per_host, wargv, "auto", port, args.job_timeout,
                                    f"digits job (2x{args.digits_ranks_per_host})")
                digits = {"ready": ready, "result": result}
                log(f"digits job: {time.monotonic() - t0:.0f} s")
    except Unavailable as e:
        log(f"simulated hosts cannot be made here: {e}")
        return 2
    machine["load_end"] = [round(x, 2) for x in os.getloadavg()]
    log(f"total: {time.monotonic() - t_all:.0f} s")
    md = markdown(machine, args, command, train, digits)
    print(md)
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        with open(args.md, "w") as f:
            f.write(md + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "command": command, "args": {k: v for k, v in vars(args).items() if k != "worker"},
                       "train": train, "digits": digits}, f, indent=1)
    if train:
        for m in args.dtypes:
            if not train["records"][m]["identical_on_every_rank"]:
                rc = 1
    if digits:
        for res in digits["result"].values():
            if not all(r["identical"] for r in res["dtypes"].values()):
                rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
