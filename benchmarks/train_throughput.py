"""Data-parallel training throughput: pycyxwiz DistributedDataParallel against PyTorch DDP (Gloo), on one
machine, each also with a sharded optimizer step and without gradient communication (the compute-only
ceiling of N busy ranks).

    python benchmarks/train_throughput.py                        # 2 ranks, both models
    python benchmarks/train_throughput.py --world-sizes 2 4 8    # on a machine with >= 8 cores
    python benchmarks/train_throughput.py --modes ddp nocomm     # without the sharded mode
    python benchmarks/train_throughput.py --modes ddp bf16 nocomm --models large   # 16-bit gradient exchange
    python benchmarks/train_throughput.py --no-torch --modes ddp unfused sharded sharded-unfused nocomm
    python benchmarks/train_throughput.py --quick                # CI smoke run: 2 ranks, small model (< 60 s)

Modes (--modes, default all three, rounds in this order):
  ddp      pycyxwiz DistributedDataParallel (DDPConfig.shard_optimizer = False); torch DDP + Adam
  sharded  the optimizer step sharded across the ranks (ZeRO stage 1: each rank updates 1/N of the parameters
           and holds the Adam state for them, then the parameters are all-gathered): pycyxwiz DDP with
           DDPConfig.shard_optimizer = True (gradients reduce-scattered); torch DDP +
           torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=Adam, the same Adam arguments)
           (skipped, with the reason, when it cannot be constructed)
  bf16     gradients exchanged in bfloat16 (not in the default modes): pycyxwiz DDP with
           DDPConfig.gradient_dtype = "bfloat16"; torch DDP with the body of bf16_compress_hook as its comm
           hook (default_hooks._compress_hook(torch.bfloat16): the public hook refuses anything but CUDA/XPU)
  bf16-sharded
           pycyxwiz only: sharded with gradients exchanged in bfloat16 (not in the default modes)
  unfused, sharded-unfused, bf16-unfused
           ddp, sharded and bf16 with pycyxwiz's fused optimizer step off (CYXWIZ_DDP_FUSED_STEP=0 while wrapping;
           not in the default modes; pycyxwiz only): each bucket all-reduced (reduce-scattered), then the
           optimizer steps on it, as before the fused step
  nocomm   the same training without any gradient exchange (the compute-only ceiling)
CYXWIZ_DDP_SHARD_OPTIMIZER is not passed to the ranks (it would shard the ddp mode too).

Models: "small" = 784-256-10 and "large" = 784-4096-4096-10 (Linear/ReLU), batch 64 per rank, cross-entropy,
Adam lr 1e-3 (torch: Adam(fused=True), the fair optimizer per ../shared/BASELINES.md; --torch-adam default
for torch.optim.Adam as usually written). One process and one thread per rank (CYXWIZ_NUM_THREADS=1,
torch.set_num_threads(1), OMP/OPENBLAS/MKL threads 1); ranks on 127.0.0.1 and a free port. Each rank
generates its own random data once. The rank-side code is benchmarks/train_throughput_worker.py.

Per framework, model and world size, one job: the modes' variants alternate in rounds inside the same
processes; a round is a barrier, warm-up steps, then steps timed one by one on every rank in a loop without
barriers. Reported (rank 0, all timed steps pooled): median and p90 step time; samples/s = world * 64 /
median. ratio = DDP / no-comm time (the cost of communication), ratio (sharded) = sharded / no-comm;
pycyxwiz/torch = torch time / pycyxwiz time, for DDP and for sharded (above 1: pycyxwiz is faster).

Writes <out-dir>/train_throughput_<tag>.md (the report printed here), .json (every step time) and .png
(step time vs world size; needs matplotlib). Every job has time limits and every process it started is
killed at its end. Exit status 1 when pycyxwiz was asked for and could not run or failed.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from allreduce import Reader, free_port, kill_all, machine_info, md_table, probe, tagged  # noqa: E402
from mlp import MODELS  # noqa: E402 - the layer sizes of the MLP the workers train

WORKER = os.path.join(HERE, "train_throughput_worker.py")
BATCH = 64
FRAMEWORKS = ["pycyxwiz", "torch"]
MODES = ["ddp", "unfused", "sharded", "sharded-unfused", "bf16", "bf16-unfused", "bf16-sharded", "nocomm"]
DEFAULT_MODES = ["ddp", "sharded", "nocomm"]
COMM_MODES = ["ddp", "unfused", "sharded", "sharded-unfused", "bf16", "bf16-unfused", "bf16-sharded"]
UNFUSED_MODES = ["unfused", "sharded-unfused", "bf16-unfused"]  # pycyxwiz only (so is bf16-sharded)
QUICK_MODES = [m for m in MODES if m not in UNFUSED_MODES + ["bf16-sharded"]]  # --quick measures every other mode (about 15 s on 2 cores with torch)
SHARD_ENV = "CYXWIZ_DDP_SHARD_OPTIMIZER"  # not passed to the ranks: it would shard the ddp mode too
VARIANT = {("pycyxwiz", "ddp"): "pycyxwiz DDP", ("pycyxwiz", "sharded"): "pycyxwiz DDP sharded",
           ("pycyxwiz", "unfused"): "pycyxwiz DDP unfused step",
           ("pycyxwiz", "sharded-unfused"): "pycyxwiz DDP sharded, unfused step",
           ("pycyxwiz", "bf16-unfused"): "pycyxwiz DDP bf16 gradients, unfused step",
           ("torch", "unfused"): "torch (no unfused mode)", ("torch", "sharded-unfused"): "torch (no unfused mode)",
           ("torch", "bf16-unfused"): "torch (no unfused mode)",
           ("pycyxwiz", "bf16-sharded"): "pycyxwiz DDP sharded, bf16 gradients",
           ("torch", "bf16-sharded"): "torch (no bf16 sharded mode)",
           ("pycyxwiz", "nocomm"): "pycyxwiz no-comm", ("pycyxwiz", "bf16"): "pycyxwiz DDP bf16 gradients",
           ("torch", "bf16"): "torch DDP bf16 compress hook",
           ("torch", "ddp"): "torch DDP", ("torch", "sharded"): "torch DDP sharded (ZeRO)",
           ("torch", "nocomm"): "torch no-comm"}
# (rounds, warmup, steps per round) for a full run and for --quick
DEFAULTS = {"small": (3, 20, 200), "large": (3, 3, 10)}
QUICK = {"small": (1, 5, 30), "large": (1, 1, 3)}
START_TIMEOUT_S = 120.0  # imports, rendezvous, data and model set-up on a busy 2-core machine
STEP_BUDGET_S = {"small": 0.25, "large": 6.0}  # per step, before oversubscription: far above any sane step


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def n_params(sizes):
    return sum(sizes[i] * sizes[i + 1] + sizes[i + 1] for i in range(len(sizes) - 1))


# ----------------------------------------------------------------- versions

PROBES = {
    "pycyxwiz": ("import json, glob, os, time, pycyxwiz as cx\n"
                 "so = sorted(glob.glob(os.path.join(os.path.dirname(cx.__file__), '_core*')))\n"
                 "built = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(os.path.getmtime(so[0]))) if so else None\n"
                 "d = getattr(cx, 'distributed', None)\n"
                 "b = cx.build_info() if hasattr(cx, 'build_info') else {}\n"
                 "print(json.dumps({'version': getattr(cx, '__version__', '?'), 'built': built, 'blas': b.get('blas'),\n"
                 "                  'compiler': b.get('compiler'),\n"
                 "                  'ddp': d is not None and hasattr(d, 'DistributedDataParallel'),\n"
                 "                  'shard': d is not None and hasattr(d, 'DDPConfig')\n"
                 "                           and hasattr(d.DDPConfig(), 'shard_optimizer'),\n"
                 "                  'bf16': d is not None and hasattr(d, 'DDPConfig')\n"
                 "                          and hasattr(d.DDPConfig(), 'gradient_dtype')}))"),
    "torch": ("import json, torch, torch.distributed as d\n"
              "print(json.dumps({'version': torch.__version__,\n"
              "                  'gloo': bool(d.is_available() and d.is_gloo_available())}))"),
}


def availability(ver, no_torch):
    """framework -> None (usable) or why not; and (framework, mode) -> why, for the modes a usable framework
    cannot run (DDP missing: no-comm alone; shard_optimizer missing: no sharded)."""
    p, t = ver["pycyxwiz"], ver["torch"]
    why = {"pycyxwiz": f"import pycyxwiz failed: {p['error']}" if "error" in p else None,
           "torch": ("disabled by --no-torch" if no_torch else
                     f"import torch failed: {t['error']} (pip install torch==2.13.0)" if "error" in t else
                     None if t.get("gloo") else "torch.distributed has no Gloo backend")}
    no_mode = {}
    if why["pycyxwiz"] is None and not p.get("ddp"):
        for m in COMM_MODES:
            no_mode[("pycyxwiz", m)] = "this pycyxwiz has no cx.distributed.DistributedDataParallel (no-comm measured alone)"
    elif why["pycyxwiz"] is None and not p.get("shard"):
        for m in ("sharded", "sharded-unfused", "bf16-sharded"):
            no_mode[("pycyxwiz", m)] = "this pycyxwiz has no cx.distributed.DDPConfig.shard_optimizer"
    if why["pycyxwiz"] is None and p.get("ddp") and not p.get("bf16"):
        for m in ("bf16", "bf16-unfused", "bf16-sharded"):
            no_mode[("pycyxwiz", m)] = "this pycyxwiz has no cx.distributed.DDPConfig.gradient_dtype"
    for m in UNFUSED_MODES:
        no_mode[("torch", m)] = "pycyxwiz's fused optimizer step has no torch counterpart"
    no_mode[("torch", "bf16-sharded")] = "pycyxwiz only (the 16-bit exchange's sharded step against float32's)"
    return why, no_mode


# ----------------------------------------------------------------- one job

def stage_budget(model, steps, warmup, world, cpus, override):
    if override:
        return override
    return 30.0 + (steps + warmup) * STEP_BUDGET_S[model] * max(1.0, world / max(cpus, 1))


def _nonblank_lines(path):
    """A rank's stderr file, without blank lines ([] when it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return []


def run_job(fw, model, world, modes, args, tmp, cpus):
    """`world` ranks of one framework training one model, the modes' rounds alternating. Returns
    {"ranks": {rank: TRAIN_RESULT}, "ready": TRAIN_READY of rank 0, "failure": str or None, "notes": [...]}."""
    rounds, warmup, steps = args.plan[model]
    port = free_port()
    env = dict(os.environ)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", SHARD_ENV):
        env.pop(k, None)
    env.update(CYXWIZ_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cmd = [sys.executable, "-u", WORKER, "--framework", fw, "--model", model, "--modes", ",".join(modes),
           "--rounds", str(rounds), "--warmup", str(warmup), "--steps", str(steps), "--rows", str(args.rows),
           "--seed", str(args.seed), "--torch-adam", args.torch_adam]
    tag = f"{fw}-{model}-{world}-{port}"
    procs, outs, errs = [], [], []
    out = {"framework": fw, "model": model, "world_size": world, "modes": modes, "ranks": {}, "ready": None,
           "failure": None, "notes": [], "errors": [], "skipped": {}, "failed_mode": None}
    budget = stage_budget(model, steps, warmup, world, cpus, args.timeout)
    t0 = time.monotonic()
    try:
        for r in range(world):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
            outs.append(os.path.join(tmp, f"{tag}.r{r}.out"))
            errs.append(os.path.join(tmp, f"{tag}.r{r}.err"))
            with open(outs[r], "wb") as fo, open(errs[r], "wb") as fe:
                procs.append(subprocess.Popen(cmd, env=e, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        reader = Reader(outs[0])
        deadline = time.monotonic() + START_TIMEOUT_S + budget
        first_exit = None
        what, running, current = "start-up", list(modes), None  # current: the mode of the round under way
        while True:
            for line in reader.lines():
                if (obj := tagged(line, "TRAIN_READY")) is not None:
                    out["ready"] = obj
                    out["skipped"] = dict(obj.get("skipped") or {})
                    running = obj.get("modes") or running
                    for m, why in out["skipped"].items():
                        log(f"  [{fw} {model} x{world}] {m}: skipped -- {why}")
                    deadline = time.monotonic() + budget
                    current = running[0]
                    what = f"round 1 {current}"
                elif (obj := tagged(line, "TRAIN_ROUND")) is not None:
                    log(f"  [{fw} {model} x{world}] round {obj['round'] + 1}/{rounds} {obj['mode']:7s}: "
                        f"median {obj['median_ms']:9.3f} ms (rank 0)")
                    deadline = time.monotonic() + budget
                    i = running.index(obj["mode"]) + 1 if obj["mode"] in running else len(running)
                    r = obj["round"] + 1 + i // len(running)
                    current = running[i % len(running)] if r <= rounds else None
                    what = f"round {r} {current}" if current else "the results"
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                if any(codes):
                    out["failure"] = f"exit status {codes}"
                break
            if any(c for c in codes if c is not None):
                first_exit = first_exit or time.monotonic()  # a rank failed: let the others report, then stop
                if time.monotonic() - first_exit > 5:
                    out["failure"] = f"rank exit status {codes} (None: still running, killed)"
                    break
            elif any(c == 0 for c in codes):
                first_exit = first_exit or time.monotonic()
                if time.monotonic() - first_exit > 60:
                    out["notes"].append("some ranks did not exit within 60 s of the others (killed)")
                    break
            if time.monotonic() > deadline:
                out["failure"] = (f"no progress within the time limit while waiting for {what} "
                                  f"({(START_TIMEOUT_S if what == 'start-up' else 0) + budget:g} s): hung or far "
                                  "too slow; killed")
                break
            time.sleep(0.05)
    finally:
        kill_all(procs)
    out["wall_s"] = time.monotonic() - t0
    for r, path in enumerate(outs):
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if (obj := tagged(line, "TRAIN_RESULT")) is not None:
                        out["ranks"][r] = obj
                    elif (obj := tagged(line, "TRAIN_ERROR")) is not None:
                        out["errors"].append(f"rank {obj.get('rank')} at {obj.get('stage')}: {obj.get('error')}")
                        words = str(obj.get("stage", "")).split()
                        if words and words[0] in ("build", "round") and words[-1] in modes:
                            out["failed_mode"] = out["failed_mode"] or words[-1]
        except OSError:
            pass
    if out["failure"] is None and len(out["ranks"]) < world:
        out["failure"] = f"only ranks {sorted(out['ranks'])} reported results"
    if out["failure"] and out["failed_mode"] is None and out["ready"] is not None:
        out["failed_mode"] = current  # hung or killed without a word: the mode whose round was under way
    if out["failure"]:
        out["ranks"] = {}  # partial results of a failed job are not reported
        detail = "; ".join(dict.fromkeys(out["errors"]))
        if not detail:
            for path in errs:
                lines = _nonblank_lines(path)
                if lines:
                    detail = " | ".join(lines[-6:])
                    break
        if detail:
            out["failure"] += f" -- {detail[:1500]}"
    else:
        for path in errs:  # warnings on a successful run are worth seeing
            lines = _nonblank_lines(path)
            if lines:
                out["notes"].append("stderr: " + " | ".join(lines[-4:])[:600])
                break
    return out


def run_framework(fw, model, world, modes, args, tmp, cpus):
    """One job with all the modes; on failure, the job is run again without the mode that failed (so a broken
    sharded step still leaves DDP and no-comm measured, a broken DDP the no-comm ceiling; without the failed
    mode known, only no-comm is run again), and a port taken under our feet is retried once."""
    jobs, todo, retried = [], list(modes), False
    while todo:
        log(f"{VARIANT[(fw, todo[0])].split()[0]} {model} x{world}: {' + '.join(todo)} ...")
        j = run_job(fw, model, world, todo, args, tmp, cpus)
        log(f"  done in {j['wall_s']:.1f} s" + (f" -- FAILED: {j['failure'][:600]}" if j["failure"] else ""))
        if j["failure"] and not j["ready"] and not retried and "in use" in j["failure"].lower():
            retried = True
            continue
        jobs.append(j)
        if not j["failure"] or len(todo) == 1:
            break
        if j["failed_mode"] in todo:
            todo = [m for m in todo if m != j["failed_mode"]]
        elif "nocomm" in todo:
            todo = ["nocomm"]
        else:
            todo = todo[1:]
    return jobs


# ----------------------------------------------------------------- summary

def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(jobs, skipped_modes):
    """(framework, model, world, mode) -> statistics of rank 0's timed steps (every round of every repeat
    pooled), plus per-rank figures; {"failure": ...} when no job delivered that variant, {"skipped": ...}
    when the framework cannot run it (skipped_modes: (framework, mode) -> why; or the ranks said so)."""
    s, ok, failed, skipped = {}, {}, {}, {}
    for j in jobs:
        for m in j["modes"]:
            key = (j["framework"], j["model"], j["world_size"], m)
            if m in j.get("skipped", {}):
                skipped.setdefault(key, j["skipped"][m])
            elif j["failure"]:
                failed.setdefault(key, j["failure"])
            else:
                ok.setdefault(key, []).append(j)
        for (fw, m), why in skipped_modes.items():
            if fw == j["framework"]:
                skipped.setdefault((fw, j["model"], j["world_size"], m), why)
    for key, why in failed.items():
        if key not in ok and key not in skipped:
            s[key] = {"failure": why}
    for key, why in skipped.items():
        if key not in ok:
            s[key] = {"skipped": why}
    for key, js in ok.items():
        m, world = key[3], key[2]
        rounds = {r: [rnd for j in js for rnd in j["ranks"][r]["times_s"][m]] for r in range(world)}
        steps = [t for rnd in rounds[0] for t in rnd]
        med = statistics.median(steps)
        rank_meds = [statistics.median([t for rnd in rounds[r] for t in rnd]) for r in range(world)]
        cpu = sum(c for j in js for c in j["ranks"][0]["cpu_s"][m])
        wall = sum(w for j in js for w in j["ranks"][0]["wall_s"][m])
        e = {"median_s": med, "p90_s": percentile(steps, 0.9), "p10_s": percentile(steps, 0.1),
             "min_s": min(steps), "max_s": max(steps), "steps": len(steps), "jobs": len(js),
             "round_medians_s": [statistics.median(rnd) for rnd in rounds[0]],
             "samples_per_s": world * BATCH / med, "rank_medians_s": rank_meds,
             "slowest_rank_median_s": max(rank_meds), "cpu_per_wall_rank0": cpu / wall if wall > 0 else None,
             "threads_rank0": js[-1]["ranks"][0].get("threads")}
        if m in COMM_MODES:
            # Replicas in sync end with equal parameters: compare each rank's per-parameter float64 sums
            # with rank 0's, relative to max(1, |sum|).
            diff = 0.0
            for j in js:
                ref = j["ranks"][0]["checksums"][m]
                for r in range(1, world):
                    diff = max([diff] + [abs(a - b) / max(1.0, abs(a)) for a, b in zip(ref, j["ranks"][r]["checksums"][m])])
            e["replica_max_rel_diff"] = diff
        s[key] = e
    return s


def fmt_ms(sec):
    if sec is None:
        return "—"
    v = sec * 1e3
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def fmt_rate(v):
    return "—" if v is None else f"{v:,.0f}"


def fmt_ratio(v):
    return "—" if v is None else f"{v:.2f}"


def cell(s, key):
    e = s.get(key)
    if e is None:
        return None, "—"
    if "failure" in e:
        return None, "FAILED"
    if "skipped" in e:
        return None, "skipped"
    return e, fmt_ms(e["median_s"])


def main_table(s, model, worlds, fws, modes):
    """The table of the brief: pycyxwiz columns, then torch's when torch ran; per framework the modes' step
    times, ratio = DDP / no-comm and ratio (sharded) = sharded / no-comm; pycyxwiz/torch for DDP and sharded;
    samples/s of DDP (of sharded when DDP was not asked for)."""
    shown = ["pycyxwiz"] + (["torch"] if "torch" in fws else [])
    label = {"ddp": "DDP", "unfused": "DDP unfused", "sharded": "sharded", "sharded-unfused": "sharded unfused",
             "bf16": "DDP bf16", "bf16-unfused": "DDP bf16 unfused",
             "bf16-sharded": "sharded bf16", "nocomm": "no-comm"}
    shown_modes = [m for m in MODES if m in modes]
    ratios = [m for m in COMM_MODES if m in modes] if "nocomm" in modes else []
    rate_mode = next((m for m in COMM_MODES if m in modes), "nocomm")
    headers = ["world size"]
    for fw in shown:
        headers += [f"{fw} {label[m]} ms" for m in shown_modes]
        headers += ["ratio" if m == "ddp" else f"ratio ({label[m]})" for m in ratios]
    if "torch" in shown:
        headers += ["pycyxwiz/torch speedup" + ("" if m == "ddp" else f" ({label[m]})") for m in COMM_MODES if m in modes]
    headers += [f"{fw} samples/s" + ("" if rate_mode == "ddp" else f" ({label[rate_mode]})") for fw in shown]
    rows = []
    for w in worlds:
        row, got = [str(w)], {}
        for fw in shown:
            for m in shown_modes:
                got[(fw, m)], txt = cell(s, (fw, model, w, m))
                row.append(txt)
            n = got[(fw, "nocomm")] if "nocomm" in modes else None
            for m in ratios:
                d = got[(fw, m)]
                row.append(fmt_ratio(d["median_s"] / n["median_s"]) if d and n else "—")
        if "torch" in shown:
            for m in COMM_MODES:
                if m in modes:
                    c, t = got[("pycyxwiz", m)], got[("torch", m)]
                    row.append(fmt_ratio(t["median_s"] / c["median_s"]) if c and t else "—")
        row += [fmt_rate(got[(fw, rate_mode)]["samples_per_s"]) if got[(fw, rate_mode)] else "—" for fw in shown]
        rows.append(row)
    return md_table(headers, rows)


def detail_table(s, models, worlds, fws):
    headers = ["model", "world", "variant", "median ms", "p90 ms", "round medians ms", "samples/s",
               "slowest rank median ms", "CPU/wall rank 0", "threads"]
    rows = []
    for model in models:
        for w in worlds:
            for fw in fws:
                for m in MODES:
                    e = s.get((fw, model, w, m))
                    if e is None:
                        continue
                    if "failure" in e or "skipped" in e:
                        rows.append([model, str(w), VARIANT[(fw, m)], "FAILED" if "failure" in e else "skipped"]
                                    + ["—"] * 6)
                        continue
                    rm = e["round_medians_s"]
                    rows.append([model, str(w), VARIANT[(fw, m)], fmt_ms(e["median_s"]), fmt_ms(e["p90_s"]),
                                 f"{fmt_ms(min(rm))}..{fmt_ms(max(rm))}" if len(rm) > 1 else fmt_ms(rm[0]),
                                 fmt_rate(e["samples_per_s"]), fmt_ms(e["slowest_rank_median_s"]),
                                 f"{e['cpu_per_wall_rank0']:.2f}" if e["cpu_per_wall_rank0"] is not None else "—",
                                 str(e["threads_rank0"] or "?")])
    return md_table(headers, rows)


# ----------------------------------------------------------------- plot

def plot(path, s, models, worlds, fws):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"plot {path}: matplotlib is not installed (pip install matplotlib); no plot drawn")
        return False
    style = {("pycyxwiz", "ddp"): ("tab:red", "-", "o"), ("pycyxwiz", "sharded"): ("tab:red", ":", "^"),
             ("pycyxwiz", "nocomm"): ("tab:red", "--", "s"), ("pycyxwiz", "bf16"): ("tab:red", "-.", "v"),
             ("torch", "bf16"): ("tab:blue", "-.", "v"), ("pycyxwiz", "unfused"): ("tab:orange", "-", "o"),
             ("pycyxwiz", "sharded-unfused"): ("tab:orange", ":", "^"), ("pycyxwiz", "bf16-unfused"): ("tab:orange", "-.", "v"),
             ("pycyxwiz", "bf16-sharded"): ("tab:red", ":", "v"),
             ("torch", "ddp"): ("tab:blue", "-", "o"), ("torch", "sharded"): ("tab:blue", ":", "^"),
             ("torch", "nocomm"): ("tab:blue", "--", "s")}
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for fw in fws:
            for m in MODES:
                pts = [(w, s[(fw, model, w, m)]) for w in worlds if "median_s" in s.get((fw, model, w, m), {})]
                if not pts:
                    continue
                c, ls, mk = style[(fw, m)]
                xs = [w for w, _ in pts]
                med = [e["median_s"] * 1e3 for _, e in pts]
                up = [(e["p90_s"] - e["median_s"]) * 1e3 for _, e in pts]
                ax.errorbar(xs, med, yerr=[[0] * len(up), up], color=c, linestyle=ls, marker=mk, capsize=3,
                            label=VARIANT[(fw, m)])
        ax.set_xticks(worlds)
        ax.set_xlabel("world size (ranks, one thread each)")
        ax.set_ylabel("step time, ms (median; bar to p90)")
        ax.set_title(f"{model} {'-'.join(map(str, MODELS[model]))}, batch {BATCH}/rank")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", type=int, nargs="+", default=None, help="default 2")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None,
                   help="default: small large (--quick: small)")
    p.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=None,
                   help="default: both (torch is skipped when not installed)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per variant (default 3; --quick: 1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every job this many times, frameworks interleaved; steps of all repeats are pooled")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per round (default: small 20, large 3)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per round (default: small 200, large 10)")
    p.add_argument("--rows", type=int, default=8192, help="rows of synthetic data per rank (default 8192)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-adam", choices=["fused", "default"], default="fused",
                   help="torch optimizer: Adam(fused=True), the fair one (default), or torch.optim.Adam as usually written")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help="modes to measure, rounds alternating in the order given (default: ddp sharded nocomm; "
                        "--quick: all four, in under 60 s on 2 cores); the ratios need nocomm")
    p.add_argument("--no-torch", action="store_true", help="measure pycyxwiz only")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke run: 2 ranks, small model, few steps, every mode unless --modes (< 60 s)")
    p.add_argument("--tag", default=None, help="result file name: train_throughput_<tag>.{md,json,png} "
                                               "(default: <cores>core, --quick: quick)")
    p.add_argument("--out-dir", default=None, help="where to write the results (default benchmarks/results; "
                                                   "--quick: a new temporary directory)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one round may take before the job is called hung (default: from model and steps)")
    a = p.parse_args(argv)
    a.world_sizes = list(dict.fromkeys(a.world_sizes or [2]))
    if any(w < 2 for w in a.world_sizes):
        p.error("--world-sizes: at least 2 ranks")
    if a.rows < 1 or a.repeats < 1 or (a.rounds is not None and a.rounds < 1) or (a.steps is not None and a.steps < 1):
        p.error("--rows, --repeats, --rounds and --steps must be at least 1")
    a.models = list(dict.fromkeys(a.models or (["small"] if a.quick else ["small", "large"])))
    a.frameworks = list(dict.fromkeys(a.frameworks or FRAMEWORKS))
    a.modes = list(dict.fromkeys(a.modes or (QUICK_MODES if a.quick else DEFAULT_MODES)))
    base = QUICK if a.quick else DEFAULTS
    a.plan = {m: (a.rounds or base[m][0], a.warmup if a.warmup is not None else base[m][1], a.steps or base[m][2])
              for m in MODELS}
    return a


def main(argv=None):
    args = parse_args(argv)
    # SIGTERM (a CI time limit, kill) unwinds through the `finally` that kills every rank we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.monotonic()
    mach = machine_info()
    cpus = mach.get("cpus_usable") or mach.get("cpus") or 1
    log("probing the libraries ...")
    ver = {"pycyxwiz": probe("pycyxwiz", PROBES),
           "torch": probe("torch", PROBES) if not args.no_torch else {"error": "--no-torch"}}
    why, no_mode = availability(ver, args.no_torch)
    fws = [f for f in args.frameworks if why[f] is None]
    tag = args.tag or ("quick" if args.quick else f"{cpus}core")
    out_dir = args.out_dir or (tempfile.mkdtemp(prefix="train_throughput_") if args.quick else os.path.join(HERE, "results"))
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, f"train_throughput_{tag}")

    rep = []
    rep.append("# Training throughput: pycyxwiz DDP vs PyTorch DDP (benchmarks/train_throughput.py)\n")
    rep.append("```")
    rep.append(f"date      {mach['date_utc']}")
    rep.append(f"machine   {mach['cpu']}, {mach['cpus']} CPUs ({cpus} usable), {mach.get('mem_gib', '?')} GiB, "
               f"Linux {mach['kernel']}, Python {mach['python']}, numpy {mach.get('numpy')}; "
               f"load average {' '.join(map(str, mach.get('load_start', [])))}")
    p = ver["pycyxwiz"]
    knobs = " ".join(f"{k}={v}" + (" (not passed to the ranks)" if k == SHARD_ENV else "")
                     for k, v in sorted(os.environ.items()) if k.startswith("CYXWIZ_") and k != "CYXWIZ_NUM_THREADS")
    rep.append(f"pycyxwiz  {p.get('version', p.get('error'))}"
               + (f", {p['blas']}" if p.get("blas") else "")
               + (f", installed module built {p['built']}" if p.get("built") else "")
               + (f"; source tree at git {mach['git']}" if mach.get("git") else "") + (f"; {knobs}" if knobs else ""))
    t = ver["torch"]
    rep.append(f"torch     {t.get('version', t.get('error'))}"
               + (f", Gloo {'available' if t.get('gloo') else 'missing'}" if "version" in t else "")
               + (f"; optimizer Adam({'fused=True' if args.torch_adam == 'fused' else 'default, per-tensor loop'})"))
    rep.append(f"models    {', '.join(f'{m} {chr(45).join(map(str, MODELS[m]))} ({n_params(MODELS[m]):,} parameters)' for m in args.models)}")
    rep.append(f"step      batch {BATCH} per rank, cross-entropy, Adam lr 1e-3; one process and one thread per rank; "
               f"127.0.0.1; data randn({args.rows}, 784) + randint(0, 10) per rank, batch gathered by index outside the timer")
    rep.append("pycyxwiz  DDP: out = ddp.forward(x); ddp.backward(loss.backward(out, y)); ddp.update_parameters(opt); "
               "sharded: the same with DDPConfig.shard_optimizer = True (DDP: False); "
               "bf16: the same with DDPConfig.gradient_dtype = 'bfloat16'; "
               "no-comm: model.forward, model.backward, opt.step(model), model.zero_grad()")
    rep.append("torch     DDP (gloo, env://, GLOO_SOCKET_IFNAME=lo): opt.zero_grad(set_to_none=True); "
               "F.cross_entropy(ddp(x), y).backward(); opt.step(); sharded: the same with "
               "ZeroRedundancyOptimizer(optimizer_class=Adam) for Adam; bf16: ddp.register_comm_hook(None, "
               "partial(default_hooks._compress_hook, torch.bfloat16)); no-comm: the same loop, model not wrapped")
    rep.append(f"modes     {' '.join(args.modes)}")
    plan = "; ".join(f"{m}: {args.plan[m][0]} rounds x ({args.plan[m][1]} warm-up + {args.plan[m][2]} timed steps)"
                     for m in args.models)
    rep.append(f"timing    {plan} per variant"
               + (f", {args.repeats} repeats (frameworks interleaved)" if args.repeats > 1 else "")
               + "; the modes' rounds alternate in the same processes; barrier before each round, none in "
               "the loop; rank 0's steps pooled: median, p90")
    rep.append(f"worlds    {' '.join(map(str, args.world_sizes))}"
               + (f" (more ranks than the {cpus} usable cores: oversubscribed)" if max(args.world_sizes) > cpus else ""))
    rep.append("```")
    skipped = {f: why[f] for f in args.frameworks if why[f]}
    for f, reason in skipped.items():
        rep.append(f"\n- skipped {f}: {reason}")
    no_mode = {k: r for k, r in no_mode.items() if k[0] in fws and k[1] in args.modes}
    for (f, m), reason in no_mode.items():
        rep.append(f"\n- skipped {VARIANT[(f, m)]}: {reason}")
    print("\n".join(rep), flush=True)

    jobs = []
    tmp = tempfile.mkdtemp(prefix="train_throughput_run_")
    try:
        for rep_i in range(args.repeats):
            if args.repeats > 1:
                log(f"repeat {rep_i + 1}/{args.repeats}:")
            for model in args.models:
                for w in args.world_sizes:
                    for fw in fws:
                        modes = [m for m in args.modes if (fw, m) not in no_mode]
                        if not modes:
                            continue
                        for j in run_framework(fw, model, w, modes, args, tmp, cpus):
                            j["repeat"] = rep_i
                            jobs.append(j)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    s = summarize(jobs, no_mode)
    body = ["\n## Step time and throughput\n",
            "ms = median step time on rank 0 (all timed steps pooled); ratio = DDP / no-comm (the cost of gradient "
            "communication; 1.00 = free), ratio (sharded) = sharded / no-comm; pycyxwiz/torch speedup = torch ms / "
            "pycyxwiz ms, for DDP and for sharded (above 1: pycyxwiz is faster); samples/s = world size x 64 / DDP "
            "median. Sharded = DDP with the optimizer step sharded across the ranks (ZeRO stage 1; torch: "
            "ZeroRedundancyOptimizer). No-comm = the same N processes training without any gradient exchange "
            "(the compute-only ceiling)."]
    for model in args.models:
        body.append(f"\n### {model} {'-'.join(map(str, MODELS[model]))} ({n_params(MODELS[model]):,} parameters, "
                    f"{n_params(MODELS[model]) * 4 / 1e6:.1f} MB of gradients per step)\n")
        body.append(main_table(s, model, args.world_sizes, fws, args.modes))
    body.append("\n### All variants\n")
    body.append("p90 = 90th percentile of rank 0's steps; round medians = min..max over rounds; slowest rank = "
                "the largest per-rank median; CPU/wall = rank 0's process CPU time (all threads) / wall time over "
                "the timed loops (1.00 = one busy thread); threads = rank 0's thread count at the end.\n")
    body.append(detail_table(s, args.models, args.world_sizes, fws))

    checks, problems = [], []
    for (fw, model, w, m), e in sorted(s.items()):
        if m in COMM_MODES and "replica_max_rel_diff" in e:
            d = e["replica_max_rel_diff"]
            checks.append(f"- {VARIANT[(fw, m)]}, {model}, {w} ranks: parameter sums after training "
                          + ("identical on every rank" if d == 0 else f"differ across ranks by up to {d:.2e} (relative)"
                             + (" -- replicas diverged" if d > 1e-5 else "")))
    for j in jobs:
        where = (f"{j['framework']} {j['model']} x{j['world_size']} ({'+'.join(j['modes'])})"
                 + (f", repeat {j['repeat'] + 1}" if args.repeats > 1 else ""))
        if j["failure"]:
            problems.append(f"- {where}: {j['failure']}")
        for n in j["notes"]:
            problems.append(f"- {where}: {n}")
        for m, why in j.get("skipped", {}).items():
            problems.append(f"- {where}: {VARIANT[(j['framework'], m)]} skipped -- {why}")
        info = (j["ready"] or {}).get("info", {})
        if j["framework"] == "pycyxwiz" and "buckets" in info:
            checks.append(f"- pycyxwiz DDP buckets, {j['model']} x{j['world_size']} (parameter tensors, bytes; in reduction order): "
                          f"{info['buckets']}")
        if j["framework"] == "pycyxwiz" and "buckets_sharded" in info and info["buckets_sharded"] != info.get("buckets"):
            checks.append(f"- pycyxwiz DDP sharded buckets, {j['model']} x{j['world_size']}: {info['buckets_sharded']}")
    if checks:
        body.append("\n### Checks\n")
        body += checks
    if problems:
        body.append("\n## Errors and notes\n")
        body += problems
    try:
        mach["load_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    wall = time.monotonic() - t_start
    body.append(f"\nTotal wall time {wall:.1f} s; load average at the end {' '.join(map(str, mach.get('load_end', [])))}")
    print("\n".join(body), flush=True)

    written = [f"{base}.md", f"{base}.json"]
    with open(f"{base}.md", "w") as f:
        f.write("\n".join(rep + body) + "\n")
    doc = {"machine": mach, "versions": ver,
           "skipped": dict(skipped, **{(f"{f} DDP" if m == "ddp" else VARIANT[(f, m)]): r for (f, m), r in no_mode.items()}),
           "wall_s": wall,
           "config": {k: v for k, v in vars(args).items()},
           "summary": [dict(framework=fw, model=model, world_size=w, mode=m, variant=VARIANT[(fw, m)], **e)
                       for (fw, model, w, m), e in sorted(s.items())],
           "jobs": [{k: (v if k != "ranks" else {str(r): x for r, x in v.items()}) for k, v in j.items()} for j in jobs]}
    with open(f"{base}.json", "w") as f:
        json.dump(doc, f, indent=1)
    if not args.no_plot and any("median_s" in e for e in s.values()):
        if plot(f"{base}.png", s, args.models, args.world_sizes, fws):
            written.append(f"{base}.png")
    rel = [os.path.relpath(x) for x in written]
    print("\nWritten: " + ", ".join(r if not r.startswith("..") else x for r, x in zip(rel, written)))

    if "pycyxwiz" in args.frameworks:
        cx = [e for (fw, *_), e in s.items() if fw == "pycyxwiz"]
        if "pycyxwiz" in skipped or not cx or any("failure" in e or "skipped" in e for e in cx):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
