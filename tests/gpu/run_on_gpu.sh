#!/usr/bin/env bash
# shellcheck disable=SC2329  # the step functions are called through `step` and `timeout bash -c`
# The one command for a machine with an NVIDIA GPU and no network (issue 14): builds pycyxwiz with CUDA,
# runs tests/gpu, the two direct checks of issue 14's items 1 and 2, then benchmarks/gpu_step.py, and
# writes every log and table under one folder with a summary.md giving each step's exit status.
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
#   BUNDLE=1                    keep summary.md, the pytest log and the benchmark reports, and pack the
#                               rest into results.tar.gz (for the device tool, which returns 8 files);
#                               default: 1 when RESULTS_DIR is $OUT, else 0
# Each step continues past a failure of the one before (a failed build skips what needs it). Exit status:
# 0 when every step passed (a check that could not create its situation here, exit 2, counts as
# inconclusive, not failed), 1 otherwise.
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

export PYTHONUNBUFFERED=1
# Nothing of a launcher's, nor the emulator: this run is about the real library (KEEP_CUDA_LIBRARY=1 keeps
# CYXWIZ_CUDA_LIBRARY, for a dry run of this script against the host emulator with SKIP_BUILD=1).
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT DISTRIBUTED_BACKEND
[ "${KEEP_CUDA_LIBRARY:-0}" = 1 ] || unset CYXWIZ_CUDA_LIBRARY CYXWIZ_EMULATED_GPUS

# step NAME LOG [--needs-build] [--check] -- COMMAND...: runs COMMAND with its output in $DIR/LOG,
# records its exit status and time. A --check's exit 2 is "inconclusive", 3 "hung".
step() {
  local name="$1" log="$2" needs_build=0 check=0
  shift 2
  while [ "$1" != "--" ]; do
    case "$1" in
      --needs-build) needs_build=1 ;;
      --check) check=1 ;;
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
  echo "== $name -> $DIR/$log"
  local t0 rc status
  t0=$(date +%s)
  { echo "\$ $*"; echo; } >"$DIR/$log"
  "$@" >>"$DIR/$log" 2>&1
  rc=$?
  case "$rc" in
    0) status="passed" ;;
    2) if [ "$check" = 1 ]; then status="inconclusive (see the JSON line)"; else status="FAILED"; fi ;;
    3) if [ "$check" = 1 ]; then status="FAILED: hung (watchdog)"; else status="FAILED"; fi ;;
    124 | 137) status="FAILED: timed out" ;;
    *) status="FAILED" ;;
  esac
  case "$status" in FAILED*) FAILED=1 ;; esac
  echo "   exit $rc: $status ($(($(date +%s) - t0)) s)"
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
export -f build build_info  # run by `timeout ... bash -c NAME`

# ---- the steps ----------------------------------------------------------------------------------
step "environment (nvidia-smi, nvcc, python)" environment.txt -- environment
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  ROWS+=("| build | - | skipped (SKIP_BUILD=1) | - | - |")
else
  step "build with CUDA" build.log -- timeout 3600 bash -c build || BUILD_OK=0
fi
step "build_info" build_info.txt --needs-build -- timeout 120 bash -c build_info || BUILD_OK=0
step "pytest tests/gpu" pytest_gpu.log --needs-build -- \
  timeout 3600 "$PY" -m pytest "${PYTEST_TARGETS:-tests/gpu}" -v -rfEs --junitxml="$DIR/pytest_gpu.xml"
step "check item 1: NotReady poll, then a launch" check_notready.log --needs-build --check -- \
  timeout 120 "$PY" tests/gpu/checks/notready_then_launch.py --timeout 90
step "check item 2: finalize with a graphed step alive (<= 60 s)" check_finalize.log --needs-build --check -- \
  timeout 120 "$PY" tests/gpu/checks/finalize_with_graph_alive.py --bound 60
step "check item 2 at exit: the atexit finalize" check_finalize_atexit.log --needs-build --check -- \
  timeout 120 "$PY" tests/gpu/checks/finalize_with_graph_alive.py --bound 60 --at-exit
# What NCCL itself does when a communicator is destroyed with a graph holding its collective still
# alive (the engine never does this: NcclBackend drops its graphs first). Informational: prints the
# probe's JSON (a hang shows as "still running" after 30 s); the engine's behaviour is the check above.
step "NCCL: destroy with a graph alive (informational)" probe_finalize_graph.log --needs-build -- \
  timeout 120 bash -c 'g++ -std=c++17 -O1 -Icpp tests/gpu/probes/api_probe.cpp -ldl -pthread -o "$DIR/api_probe" \
    && lib="$("$PY" -c "import os, pycyxwiz; print(os.path.join(os.path.dirname(pycyxwiz.__file__), \"libcyxwiz_cuda.so\"))")" \
    && { "$DIR/api_probe" "$lib" finalize_graph 4096 30; \
         PROBE_DESTROY_GRAPH_FIRST=1 "$DIR/api_probe" "$lib" finalize_graph 4096 30; true; }'
step "benchmarks/gpu_step.py --quick" gpu_step_quick.log --needs-build -- \
  timeout 900 "$PY" benchmarks/gpu_step.py --quick --no-plot --tag quick --out-dir "$DIR"
if [ "${GPU_STEP_FULL:-1}" != 0 ]; then
  step "benchmarks/gpu_step.py (full)" gpu_step_full.log --needs-build -- \
    timeout 1800 "$PY" benchmarks/gpu_step.py --tag full --out-dir "$DIR"
fi

# ---- summary.md -----------------------------------------------------------------------------------
{
  echo "# GPU run of pycyxwiz ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Made by \`tests/gpu/run_on_gpu.sh\`. GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)."
  echo "Overall: $([ "$FAILED" = 0 ] && echo "every step passed" || echo "**some step failed**")."
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
