#!/usr/bin/env bash
# shellcheck disable=SC2329  # the step functions are called through `step` and `timeout bash -c`
# The one command for a machine with an NVIDIA GPU and no network (issue 14): builds pycyxwiz with CUDA,
# runs tests/gpu, the two direct checks of issue 14's items 1 and 2, then benchmarks/gpu_step.py, then the
# CPU benchmarks that need more cores than the 2 of the development machine (issue 25, item 4: 8 ranks of
# allreduce.py, train_throughput.py and torch_backend.py), and writes every log and table under one folder
# with a summary.md giving each step's exit status and time, and the benchmarks' figures as tables.
#
#   tests/gpu/run_on_gpu.sh [RESULTS_DIR]
#
# RESULTS_DIR: the argument, else $OUT when set (the device machines' folder), else gpu_results/<date>/.
# Environment:
#   PYTHON                      the Python to build and run with (default python3)
#   SCIPY_OPENBLAS_WHEEL        path of a scipy-openblas32 wheel to install first (pip --no-index); or put
#                               it in wheels/ (any *.whl there is installed the same way)
#   CYXWIZ_CUDA_ARCHITECTURES   CMake's list (default: this GPU's, e.g. 90-real, from nvidia-smi)
#   SKIP_BUILD=1                use the pycyxwiz already installed
#   PYTEST_TARGETS              what pytest runs (default tests/gpu)
#   GPU_STEP_FULL=0             only the quick benchmark run (default: quick, then the full run)
#   GPU_STEP_AMP=0              no mixed-precision (bf16) run of the benchmark (default: after the full run)
#   BUNDLE=1                    keep summary.md, the pytest log and the benchmark reports, and pack the
#                               rest into results.tar.gz (for the device tool, which returns 8 files);
#                               default: 1 when RESULTS_DIR is $OUT, else 0
#   BUDGET_S                    seconds the whole run may take (default 360: a device session has 15
#                               minutes in all, machine start included). Each step has an estimate below
#                               (EST_*, from the H200 machine's run); a step whose estimate would take the
#                               run past the budget is skipped, with a line saying so, and no step's
#                               timeout reaches past the budget
#   CPU_BENCH=0                 skip the CPU benchmarks
#   CPU_RANKS                   ranks of the CPU benchmarks (default 8: one per 2 cores of the 16-core
#                               device machine; set 2 for a dry run on a 2-core machine)
# Each step continues past a failure of the one before (a failed build skips what needs it). Exit status:
# 0 when every step passed (a check that could not create its situation here, exit 2, counts as
# inconclusive, not failed; a step skipped for the budget is reported, not failed), 1 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT" || exit 1
PY="${PYTHON:-python3}"
DIR="${1:-${OUT:-gpu_results/$(date -u +%Y%m%d-%H%M%S)}}"
mkdir -p "$DIR" || exit 1
DIR="$(cd "$DIR" && pwd)"
if [ -z "${BUNDLE:-}" ]; then
  BUNDLE=0
  if [ -n "${OUT:-}" ] && [ "$DIR" = "$(cd "$OUT" 2>/dev/null && pwd)" ]; then BUNDLE=1; fi
fi
SUMMARY="$DIR/summary.md"
FAILED=0
BUILD_OK=1
ROWS=()
T_START=$(date +%s)
BUDGET_S="${BUDGET_S:-360}"
CPU_RANKS="${CPU_RANKS:-8}"
BUDGET_SKIPPED=()

# Estimated seconds per step, to skip what would not fit the budget. The H200 machine's run (issue 25:
# 16-core Xeon, main at 84b6835) took 34 s to build and 152 s for everything up to gpu_step's full run;
# the three CPU benchmarks with their default settings took about 5 minutes together at 8 ranks there,
# so they run here with bounded settings (see each step) that should take about 3 minutes.
EST_ENVIRONMENT=5
EST_BUILD=60
EST_BUILD_INFO=5
EST_PYTEST=60
EST_CHECK=10
EST_PROBE=10
EST_GPU_STEP_QUICK=20
EST_GPU_CNN_STEP=60     # ResNet-18 at batch 256, 3 variants x 3 rounds x 25 steps, cudnn.benchmark's search (not yet run there)
EST_GPU_TRANSFORMER_STEP=60  # GPT-2-small sizes, 4 blocks, batch 8 x 1024, 3 variants x 3 rounds x 13 steps (not yet run there)
EST_GPU_STEP_FULL=90  # with the lockstep drift check: 4 models x 20-50 steps, CPU ones at batch 1024 too
EST_ALLREDUCE=45        # 2 libraries x 8 sizes x (0.5 s timed with barriers + 0.5 s back to back) + starts
EST_TRAIN_THROUGHPUT=80 # 2 frameworks x 2 models x 3 modes x 2 rounds; the 20M model's 13 steps a round
EST_TORCH_BACKEND=75    # 2 models x (compute only, gloo, cyxwiz, float64 reference): 8 launches of 8 ranks

export PYTHONUNBUFFERED=1
# Nothing of a launcher's, nor the emulator: this run is about the real library (KEEP_CUDA_LIBRARY=1 keeps
# CYXWIZ_CUDA_LIBRARY, for a dry run of this script against the host emulator with SKIP_BUILD=1).
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT DISTRIBUTED_BACKEND
[ "${KEEP_CUDA_LIBRARY:-0}" = 1 ] || unset CYXWIZ_CUDA_LIBRARY CYXWIZ_EMULATED_GPUS

elapsed() { echo $(($(date +%s) - T_START)); }

# step NAME LOG [--needs-build] [--needs-pycyxwiz] [--check] [--limited-ok] [--est S] [--timeout S] -- COMMAND...: runs
# COMMAND with its output in $DIR/LOG, records its exit status and time. A --check's exit 2 is
# "inconclusive", 3 "hung". --est: the step's expected seconds; it is skipped when the run's elapsed
# time plus that would pass BUDGET_S. --timeout: its limit (`timeout`), cut to what is left of the budget.
step() {
  local name="$1" log="$2" needs_build=0 needs_cx=0 check=0 limited=0 est=0 limit=""
  shift 2
  while [ "$1" != "--" ]; do
    case "$1" in
      --needs-build) needs_build=1 ;;
      --needs-pycyxwiz) needs_cx=1 ;;
      --check) check=1 ;;
      --limited-ok) limited=1 ;;  # gpu_step.py: exit 2 = no GPU for torch (LIMITED verdict) or none at all
      --est) est="$2"; shift ;;
      --timeout) limit="$2"; shift ;;
    esac
    shift
  done
  shift
  if [ "$needs_build" = 1 ] && [ "$BUILD_OK" = 0 ]; then
    echo "== $name: skipped (the CUDA build failed)"
    ROWS+=("| $name | - | skipped: the CUDA build failed | \`$log\` | - |")
    FAILED=1
    return 0
  fi
  if [ "$needs_cx" = 1 ] && ! "$PY" -c 'import pycyxwiz' >/dev/null 2>&1 \
    && { sleep 5; ! "$PY" -c 'import pycyxwiz' >/dev/null 2>&1; }; then
    echo "== $name: skipped (import pycyxwiz fails: no build)"
    ROWS+=("| $name | - | skipped: import pycyxwiz fails | \`$log\` | - |")
    FAILED=1
    return 0
  fi
  local used left
  used=$(elapsed)
  left=$((BUDGET_S - used))
  if [ $((used + est)) -gt "$BUDGET_S" ]; then
    echo "== $name: skipped: it would pass the budget ($used s used + about $est s > BUDGET_S=$BUDGET_S s)"
    ROWS+=("| $name | - | skipped: it would pass the budget ($used + about $est > $BUDGET_S s) | \`$log\` | - |")
    BUDGET_SKIPPED+=("$name")
    return 0
  fi
  local cut=0
  if [ -n "$limit" ] && [ "$limit" -gt "$left" ]; then
    limit=$((left > 1 ? left : 1))  # `timeout 0` would mean no limit
    cut=1
  fi
  echo "== $name -> $DIR/$log (about $est s; $used s of the $BUDGET_S s budget used${limit:+; limit $limit s})"
  local t0 rc status
  t0=$(date +%s)
  { echo "\$ $*"; echo; } >"$DIR/$log"
  if [ -n "$limit" ]; then
    timeout -k 10 "$limit" "$@" >>"$DIR/$log" 2>&1
  else
    "$@" >>"$DIR/$log" 2>&1
  fi
  rc=$?
  case "$rc" in
    0) status="passed" ;;
    2) if [ "$check" = 1 ]; then status="inconclusive (see the JSON line)"
       elif [ "$limited" = 1 ]; then status="limited: no verdict here (see its log)"
       else status="FAILED"; fi ;;
    3) if [ "$check" = 1 ]; then status="FAILED: hung (watchdog)"; else status="FAILED"; fi ;;
    124 | 137) if [ "$cut" = 1 ]; then status="FAILED: timed out (at the budget, $limit s)"; else status="FAILED: timed out"; fi ;;
    *) status="FAILED" ;;
  esac
  case "$status" in FAILED*) FAILED=1 ;; esac
  echo "   exit $rc: $status ($(($(date +%s) - t0)) s; $(elapsed) s of $BUDGET_S s used)"
  ROWS+=("| $name | $rc | $status | \`$log\` | $(($(date +%s) - t0)) |")
  return "$rc"
}

environment() {
  echo "## date"; date -u
  echo "## git"; git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "(no git)"
  git -C "$ROOT" status --short 2>/dev/null | head -50
  echo "## nvidia-smi"; nvidia-smi
  echo "## nvidia-smi -q"; nvidia-smi -q
  echo "## nvcc"; command -v nvcc && nvcc --version
  echo "## python"; "$PY" -c 'import sys; print(sys.executable, sys.version)'
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|numpy|nvidia-(cublas|nccl|cuda-runtime)|scikit-build-core|pybind11|scipy-openblas32|cmake|ninja|pytest) '
  echo "## cpu"; nproc; grep -m1 'model name' /proc/cpuinfo
  command -v lscpu >/dev/null && lscpu
  command -v free >/dev/null && free -g
  echo "## Open MPI (benchmarks/allreduce.py's Open MPI shm column)"
  if command -v mpirun >/dev/null; then mpirun --version 2>&1 | head -1; else echo "mpirun not found"; fi
  "$PY" -c 'import mpi4py; print("mpi4py", mpi4py.__version__)' 2>&1 | tail -1
  return 0
}

build() {
  local wheels=()
  [ -n "${SCIPY_OPENBLAS_WHEEL:-}" ] && wheels+=("$SCIPY_OPENBLAS_WHEEL")
  if [ -d "$ROOT/wheels" ]; then
    for w in "$ROOT"/wheels/*.whl; do [ -e "$w" ] && wheels+=("$w"); done
  fi
  if [ "${#wheels[@]}" -gt 0 ]; then
    "$PY" -m pip install --no-index --no-deps "${wheels[@]}" || return 1
  fi
  "$PY" -c 'import scipy_openblas32' 2>/dev/null \
    || echo "warning: scipy_openblas32 is not importable; set SCIPY_OPENBLAS_WHEEL or put the wheel in wheels/"
  if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  local archs="${CYXWIZ_CUDA_ARCHITECTURES:-}"
  if [ -z "$archs" ]; then
    archs="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
    [ -n "$archs" ] && archs="${archs}-real"
  fi
  local args=(--no-build-isolation --no-deps . -Cbuild-dir=build/cuda -Ccmake.define.CYXWIZ_CUDA=ON)
  [ -n "$archs" ] && args+=("-Ccmake.define.CYXWIZ_CUDA_ARCHITECTURES=$archs")
  "$PY" -m pip install -v "${args[@]}"
}

build_info() {
  "$PY" - <<'EOF'
import json
import pycyxwiz as cx
info = cx.build_info()
print(json.dumps(info, indent=1, default=str))
print("is_available", cx.cuda.is_available(), "device_count", cx.cuda.device_count(),
      "unavailable_reason", cx.cuda.unavailable_reason())
for i in range(cx.cuda.device_count()):
    print(i, cx.cuda.get_device_properties(i))
assert info["cuda"] and cx.cuda.is_available(), "not a CUDA build, or no usable GPU"
EOF
}

export PY ROOT DIR
export -f build build_info environment  # run by `timeout ... bash -c NAME`

# ---- the steps ----------------------------------------------------------------------------------
echo "Budget: $BUDGET_S s for the whole run (BUDGET_S). Estimates, s: build $EST_BUILD, pytest $EST_PYTEST," \
  "checks 3 x $EST_CHECK, probe $EST_PROBE, gpu_step quick $EST_GPU_STEP_QUICK + full and bf16 2 x $EST_GPU_STEP_FULL;" \
  "CPU benchmarks at $CPU_RANKS ranks: allreduce $EST_ALLREDUCE, train_throughput $EST_TRAIN_THROUGHPUT," \
  "torch_backend $EST_TORCH_BACKEND. A step that would pass the budget is skipped."
step "environment (nvidia-smi, nvcc, python, cpu)" environment.txt --est "$EST_ENVIRONMENT" --timeout 120 -- \
  bash -c environment
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  ROWS+=("| build | - | skipped (SKIP_BUILD=1) | - | - |")
else
  step "build with CUDA" build.log --est "$EST_BUILD" --timeout 3600 -- bash -c build || BUILD_OK=0
fi
step "build_info" build_info.txt --needs-build --est "$EST_BUILD_INFO" --timeout 120 -- bash -c build_info || BUILD_OK=0
step "pytest tests/gpu" pytest_gpu.log --needs-build --est "$EST_PYTEST" --timeout 3600 -- \
  "$PY" -m pytest "${PYTEST_TARGETS:-tests/gpu}" -v -rfEs --junitxml="$DIR/pytest_gpu.xml"
# Under the host emulator (a dry run: KEEP_CUDA_LIBRARY=1 with CYXWIZ_CUDA_LIBRARY set), item 1 takes the
# arguments tests/gpu/test_runtime_checks.py gives it there: 8192-wide GEMMs emulated on the CPU never finish.
CHECK1_ARGS=()
if [ "${KEEP_CUDA_LIBRARY:-0}" = 1 ] && [ -n "${CYXWIZ_CUDA_LIBRARY:-}" ]; then CHECK1_ARGS=(--variant nccl --size 256); fi
step "check item 1: NotReady poll, then a launch" check_notready.log --needs-build --check --est "$EST_CHECK" --timeout 120 -- \
  "$PY" tests/gpu/checks/notready_then_launch.py ${CHECK1_ARGS[@]+"${CHECK1_ARGS[@]}"} --timeout 90
step "check item 2: finalize with a graphed step alive (<= 60 s)" check_finalize.log --needs-build --check --est "$EST_CHECK" --timeout 120 -- \
  "$PY" tests/gpu/checks/finalize_with_graph_alive.py --bound 60
step "check item 2 at exit: the atexit finalize" check_finalize_atexit.log --needs-build --check --est "$EST_CHECK" --timeout 120 -- \
  "$PY" tests/gpu/checks/finalize_with_graph_alive.py --bound 60 --at-exit
# What NCCL itself does when a communicator is destroyed with a graph holding its collective still
# alive (the engine never does this: NcclBackend drops its graphs first). Informational: prints the
# probe's JSON (a hang shows as "still running" after 30 s); the engine's behaviour is the check above.
# shellcheck disable=SC2016  # $DIR and $PY are expanded by the inner bash (exported)
step "NCCL: destroy with a graph alive (informational)" probe_finalize_graph.log --needs-build --est "$EST_PROBE" --timeout 120 -- \
  bash -c 'g++ -std=c++17 -O1 -Icpp tests/gpu/probes/api_probe.cpp -ldl -pthread -o "$DIR/api_probe" \
    && lib="$("$PY" -c "import os, pycyxwiz; print(os.path.join(os.path.dirname(pycyxwiz.__file__), \"libcyxwiz_cuda.so\"))")" \
    && { "$DIR/api_probe" "$lib" finalize_graph 4096 30; \
         PROBE_DESTROY_GRAPH_FIRST=1 "$DIR/api_probe" "$lib" finalize_graph 4096 30; true; }'
# The quick run is the smoke test; the lockstep drift check (the correctness verdict) runs once, in the
# full run, unless there is none.
QUICK_DRIFT=()
[ "${GPU_STEP_FULL:-1}" != 0 ] && QUICK_DRIFT=(--no-drift)
step "benchmarks/gpu_step.py --quick" gpu_step_quick.log --needs-build --limited-ok --est "$EST_GPU_STEP_QUICK" --timeout 900 -- \
  "$PY" benchmarks/gpu_step.py --quick --no-plot --tag quick --out-dir "$DIR" ${QUICK_DRIFT[@]+"${QUICK_DRIFT[@]}"}
# Issue 33's GPU target: ResNet-18 at batch 256 on 3x32x32, ours eager and graphed against torch with
# cudnn.benchmark (<= 1.0x and <= 0.8x).
step "benchmarks/gpu_cnn_step.py" gpu_cnn_step.log --needs-build --limited-ok --est "$EST_GPU_CNN_STEP" --timeout 600 -- \
  "$PY" benchmarks/gpu_cnn_step.py --rounds 3 --out "$DIR/gpu_cnn_step.md"
step "benchmarks/gpu_cnn_step.py, CYXWIZ_CUDNN_BENCHMARK=1" gpu_cnn_step_search.log --needs-build --limited-ok --est "$EST_GPU_CNN_STEP" --timeout 600 -- \
  env CYXWIZ_CUDNN_BENCHMARK=1 "$PY" benchmarks/gpu_cnn_step.py --rounds 3 --out "$DIR/gpu_cnn_step_search.md"
# Issue 35's sequence layers on the GPU: a GPT-2-small-sized causal LM (4 blocks) under bf16 autocast,
# ours eager and graphed against torch's TransformerEncoderLayer (SDPA) under torch.autocast.
step "benchmarks/gpu_transformer_step.py" gpu_transformer_step.log --needs-build --limited-ok --est "$EST_GPU_TRANSFORMER_STEP" --timeout 600 -- \
  "$PY" benchmarks/gpu_transformer_step.py --rounds 3 --out "$DIR/gpu_transformer_step.md"
if [ "${GPU_STEP_FULL:-1}" != 0 ]; then
  step "benchmarks/gpu_step.py (full)" gpu_step_full.log --needs-build --limited-ok --est "$EST_GPU_STEP_FULL" --timeout 1800 -- \
    "$PY" benchmarks/gpu_step.py --tag full --out-dir "$DIR"
fi
# Issue 27's mixed-precision figure: both frameworks under bf16 autocast (pycyxwiz: cuBLASLt with 16-bit
# inputs), with the GPU-vs-CPU autocast check; the ratio to the full run's float32 step is the target
# (at most 0.6x on the 20M model at batch 1024).
if [ "${GPU_STEP_AMP:-1}" != 0 ]; then
  step "benchmarks/gpu_step.py --amp bf16" gpu_step_amp.log --needs-build --limited-ok --est "$EST_GPU_STEP_FULL" --timeout 1800 -- \
    "$PY" benchmarks/gpu_step.py --amp bf16 --tag amp_bf16 --out-dir "$DIR"
fi

# The CPU benchmarks that need more cores than the development machine's 2 (issue 25, item 4): one
# process and one thread per rank, on this machine's cores. They need pycyxwiz, not the GPU. Bounded
# settings (the scripts' defaults took about 5 minutes together at 8 ranks on the 16-core machine):
#   allreduce.py        pycyxwiz (shm) and Open MPI shm only (no TCP backends, no loopback measurement),
#                       4 KiB..64 MiB (8 sizes), 0.5 s of timed calls per size and mode (default 2 s)
#   train_throughput.py both models, both frameworks, the three modes, 2 rounds (default 3)
#   torch_backend.py    the MLPs (not the CNN), 200 timed steps of the small one and 10 of the 20M one
#                       (default 20), no all_reduce sizes (allreduce.py measures the collective)
# An Open MPI that is missing (no mpirun, no mpi4py) leaves its column out, with the reason in the report.
if [ "${CPU_BENCH:-1}" != 0 ]; then
  R="$CPU_RANKS"
  step "CPU: benchmarks/allreduce.py, $R ranks (pycyxwiz, Open MPI shm)" "allreduce_${R}ranks.md" \
    --needs-pycyxwiz --est "$EST_ALLREDUCE" --timeout 300 -- \
    "$PY" benchmarks/allreduce.py --world-sizes "$R" --backends pycyxwiz mpi-shm --seconds 0.5 \
    --max-bytes 67108864 --no-loopback --json "$DIR/allreduce_${R}ranks.json"
  step "CPU: benchmarks/train_throughput.py, $R ranks" "train_throughput_${R}ranks.log" \
    --needs-pycyxwiz --est "$EST_TRAIN_THROUGHPUT" --timeout 400 -- \
    "$PY" benchmarks/train_throughput.py --world-sizes "$R" --rounds 2 --tag "${R}ranks" --out-dir "$DIR" --no-plot
  step "CPU: benchmarks/torch_backend.py, $R ranks" "torch_backend_${R}ranks.log" \
    --needs-pycyxwiz --est "$EST_TORCH_BACKEND" --timeout 400 -- \
    "$PY" benchmarks/torch_backend.py --world-size "$R" --models 784-256-10,784-4096-4096-10 \
    --steps 784-256-10=200,784-4096-4096-10=10 --no-allreduce --out "$DIR/torch_backend_${R}ranks"
fi

# The CPU benchmarks' figures as tables for summary.md (their full reports go into the bundle).
cpu_tables() {
  "$PY" - "$DIR" "$CPU_RANKS" <<'PYTABLES'
import json, os, sys

d, R = sys.argv[1], int(sys.argv[2])


def load(name):
    path = os.path.join(d, name)
    if not os.path.exists(path):
        print(f"\n`{name}`: not written (the step failed or was skipped; see the table above)")
        return None
    with open(path) as f:
        return json.load(f)


def t(us):
    return "-" if us is None else (f"{us:.3g} us" if us < 1000 else f"{us / 1000:.3g} ms")


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def num(v):
    return "-" if v is None else f"{v:.4g}"


def bw(e):
    return f"{e['busbw_GBps']:.2f}" if e.get("busbw_GBps") else "-"


print(f"\n### all_reduce, {R} ranks (benchmarks/allreduce.py: float32 SUM in place, median of the slowest rank)")
doc = load(f"allreduce_{R}ranks.json")
if doc:
    got = {(e["backend"], e["bytes"]): e for e in doc["summary"] if e["world_size"] == R}
    print("\n| size | pycyxwiz (shm) | Open MPI shm | Open MPI / pycyxwiz time | pycyxwiz busbw GB/s | Open MPI busbw GB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in sorted({b for _, b in got}):
        a, m = got.get(("pycyxwiz", n), {}), got.get(("mpi-shm", n), {})
        print(f"| {size(n)} | {t(a.get('median_us'))} | {t(m.get('median_us'))} | "
              f"{ratio(m.get('median_us'), a.get('median_us'))} | {bw(a)} | {bw(m)} |")
    for b, why in doc.get("skipped", {}).items():
        print(f"\n{doc.get('labels', {}).get(b, b)} skipped: {why}")

print(f"\n### DDP step, {R} ranks (benchmarks/train_throughput.py: median ms on rank 0, batch 64 per rank, Adam)")
doc = load(f"train_throughput_{R}ranks.json")
if doc:
    ms = {(e["framework"], e["model"], e["mode"]): e["median_s"] * 1e3 for e in doc["summary"] if e["world_size"] == R}
    print("\n| model | pycyxwiz DDP | sharded | no-comm | DDP / no-comm | sharded / no-comm | "
          "torch DDP (gloo) | torch ZeRO | torch no-comm | torch DDP / ours |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in ("small", "large"):
        if not any(k[1] == model for k in ms):
            continue
        ours = {mode: ms.get(("pycyxwiz", model, mode)) for mode in ("ddp", "sharded", "nocomm")}
        th = {mode: ms.get(("torch", model, mode)) for mode in ("ddp", "sharded", "nocomm")}
        print(f"| {model} | {num(ours['ddp'])} | {num(ours['sharded'])} | {num(ours['nocomm'])} | "
              f"{ratio(ours['ddp'], ours['nocomm'])} | {ratio(ours['sharded'], ours['nocomm'])} | {num(th['ddp'])} | "
              f"{num(th['sharded'])} | {num(th['nocomm'])} | {ratio(th['ddp'], ours['ddp'])} |")
    for s in doc.get("skipped", []):
        print(f"\nskipped: {s}")

print(f"\n### PyTorch DDP on \"cyxwiz\" and \"gloo\", {R} ranks (benchmarks/torch_backend.py: ms per step, slowest rank)")
doc = load(f"torch_backend_{R}ranks.json")
if doc:
    print("\n| model | compute only | gloo | cyxwiz | gloo / cyxwiz | vs float64 ref. after 3 steps, max / rms: "
          "gloo; cyxwiz | at the end: gloo; cyxwiz |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in doc["ddp"]:
        e = lambda k: "{:.1e} / {:.1e}".format(*r[k]) if k in r else "-"  # noqa: E731
        print(f"| {r['model']} | {r['compute_ms']:.4g} | {r['gloo_ms']:.4g} | {r['cyxwiz_ms']:.4g} | {r['speedup']:.2f}x | "
              f"{e('gloo_vs_ref_early')}; {e('cyxwiz_vs_ref_early')} | "
              f"{r['gloo_vs_ref']:.1e} / {r['gloo_vs_ref_rms']:.1e}; {r['cyxwiz_vs_ref']:.1e} / {r['cyxwiz_vs_ref_rms']:.1e} |")
    if doc["allreduce"]:
        print("\n| all_reduce | gloo ms | cyxwiz (torch.distributed) ms | cx.distributed.all_reduce ms |")
        print("| --- | --- | --- | --- |")
        for a in doc["allreduce"]:
            print(f"| {size(a['bytes'])} | {a['gloo_ms']:.3f} | {a['cyxwiz_torch_ms']:.3f} | {a['cx_ms']:.3f} |")
PYTABLES
}

# ---- summary.md -----------------------------------------------------------------------------------
USED=$(elapsed)
{
  echo "# GPU run of pycyxwiz ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Made by \`tests/gpu/run_on_gpu.sh\`. GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)."
  if [ "$FAILED" != 0 ]; then
    echo "Overall: **some step failed**."
  elif [ "${#BUDGET_SKIPPED[@]}" -gt 0 ]; then
    echo "Overall: every step that ran passed; ${#BUDGET_SKIPPED[@]} skipped for the budget."
  else
    echo "Overall: every step passed."
  fi
  skipped_list=""
  for s in ${BUDGET_SKIPPED[@]+"${BUDGET_SKIPPED[@]}"}; do skipped_list+="${skipped_list:+; }$s"; done
  echo "Time: $USED s of the $BUDGET_S s budget (BUDGET_S)${skipped_list:+; skipped for it: $skipped_list}."
  echo
  echo "| step | exit | result | log | seconds |"
  echo "| --- | --- | --- | --- | --- |"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "## The checks' JSON lines (exit 0 pass, 1 bug shown, 2 inconclusive, 3 hung)"
  for f in check_notready.log check_finalize.log check_finalize_atexit.log; do
    [ -f "$DIR/$f" ] || continue
    echo
    echo "\`$f\`:"
    echo '```'
    grep '^{' "$DIR/$f" | tail -1
    echo '```'
  done
  echo
  echo "## pytest tests/gpu"
  echo '```'
  [ -f "$DIR/pytest_gpu.log" ] && grep -E '^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed)' "$DIR/pytest_gpu.log" | tail -60
  echo '```'
  echo
  echo "## benchmarks/gpu_step.py (target of issue 6: step <= 0.3x PyTorch's on the small MLP, <= 1.0x on the 20M model)"
  for f in "$DIR"/gpu_step_full.md "$DIR"/gpu_step_quick.md; do
    [ -f "$f" ] || continue
    echo
    echo "### $(basename "$f")"
    echo
    cat "$f"
    break
  done
  if [ -f "$DIR/gpu_cnn_step.md" ]; then
    echo
    echo "## benchmarks/gpu_cnn_step.py (target of issue 33: eager <= 1.0x torch with cudnn.benchmark, graphed <= 0.8x)"
    echo
    cat "$DIR/gpu_cnn_step.md"
    [ -f "$DIR/gpu_cnn_step_search.md" ] && { echo; cat "$DIR/gpu_cnn_step_search.md"; }
  fi
  if [ -f "$DIR/gpu_transformer_step.md" ]; then
    echo
    echo "## benchmarks/gpu_transformer_step.py (issue 35: GPT-2-small-sized, bf16 autocast, ours / torch)"
    echo
    cat "$DIR/gpu_transformer_step.md"
  fi
  if [ "${CPU_BENCH:-1}" != 0 ]; then
    echo
    echo "## CPU benchmarks at $CPU_RANKS ranks on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
    echo
    echo "One process and one thread per rank; bounded settings (see the script). Full reports: \`allreduce_${CPU_RANKS}ranks.md\`,"
    echo "\`train_throughput_${CPU_RANKS}ranks.md\`, \`torch_backend_${CPU_RANKS}ranks.md\` (with their JSON; in results.tar.gz under \$OUT)."
    cpu_tables 2>&1 || echo "(the tables could not be made from the JSON files)"
  fi
} >"$SUMMARY"

if [ "$BUNDLE" = 1 ]; then
  # The device tool returns at most 8 files: keep the main ones, pack everything in results.tar.gz.
  tmp="$(mktemp -d)"
  tar -C "$DIR" -czf "$tmp/results.tar.gz" . && mv "$tmp/results.tar.gz" "$DIR/"
  rmdir "$tmp"
  for f in "$DIR"/*; do
    case "$(basename "$f")" in
      summary.md | results.tar.gz | pytest_gpu.log | build_info.txt | gpu_step_full.md | gpu_step_quick.md | check_notready.log) ;;
      *) rm -rf "$f" ;;
    esac
  done
fi

echo
cat "$SUMMARY"
echo
echo "results: $DIR"
exit "$FAILED"
