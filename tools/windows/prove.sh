#!/usr/bin/env bash
# prove.sh [OUT]: the engine as a Windows program, proven under Wine. Cross-compiles the C++ core,
# tests/cpp (rank_checks, allreduce_bench) and examples/cpp with MinGW-w64, then runs them as Windows
# processes on 127.0.0.1:
#   - tests/test_cpp_ranks.py with rank_checks.exe under wine: 3 ranks, every collective, op and dtype
#     against a reference over Winsock TCP and over the file-mapping transport; a killed rank named by
#     every survivor; a stranger on the port; a wrong secret refused; DDP equal to one process; a
#     checkpoint written, read back and replaced;
#   - tests/windows: the BLAS DLL, and launch_distributed.bat under Wine's cmd;
#   - examples/cpp on 2 ranks (the loss must fall);
#   - allreduce_bench.exe on 3 ranks over both transports: OUT/allreduce_wine.txt (Wine's, so the
#     figures are relative only).
# Needs g++-mingw-w64-x86-64-posix, wine64, cmake, ninja and a Python with pytest and scipy-openblas32
# ($PYTHON, default python3). Exit 0 when everything passed; tools/windows/README.md. PROVE_TESTS names the
# pytest files of the rank checks (default tests/test_cpp_ranks.py tests/windows); PROVE_BUILD_ONLY=1 stops
# after the builds and the Wine prefix (CI builds in the background, then calls it again to run the checks).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
out="$(mkdir -p "${1:-build/windows}" && cd "${1:-build/windows}" && pwd)"
PYTHON="${PYTHON:-python3}"
for tool in x86_64-w64-mingw32-g++-posix wine cmake ninja; do
  command -v "$tool" >/dev/null || { echo "prove.sh: $tool not found" >&2; exit 1; }
done
export WINEDEBUG=-all
export CYXWIZ_WINEPREFIX="${CYXWIZ_WINEPREFIX:-$out/wineprefix}" WINEPREFIX="${CYXWIZ_WINEPREFIX:-$out/wineprefix}"
jobs="$(nproc 2>/dev/null || echo 2)"
step() { echo "== prove.sh: $* ($SECONDS s)"; }

step "the Windows OpenBLAS"
blas="$(PYTHON="$PYTHON" tools/windows/fetch_openblas.sh "$out/openblas" | tail -1)"
dll="$out/openblas/scipy_openblas32/lib/libscipy_openblas.dll"

step "the core (MinGW-w64), installed as the CMake package cyxwiz"
cmake -S . -B "$out/core" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$root/cmake/mingw-w64.cmake" \
  -DOpenBLAS_DIR="$blas" >/dev/null
cmake --build "$out/core" -j "$jobs"
cmake --install "$out/core" --prefix "$out/prefix" >/dev/null

step "tests/cpp and examples/cpp against the package"
for program in tests/cpp examples/cpp; do
  dir="$out/$(echo "$program" | tr / _)"
  cmake -S "$program" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$root/cmake/mingw-w64.cmake" \
    -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null
  cmake --build "$dir" -j "$jobs"
  cp "$dll" "$dir/"
done

# One Wine process first: it creates the prefix (about 10 s), which ranks starting together must not race for.
step "the Wine prefix"
wine cmd /c exit 0 </dev/null >/dev/null 2>&1 || true
if command -v wineserver >/dev/null; then timeout 60 wineserver -w || true; fi  # wineboot's first start finishes

if [ -n "${PROVE_BUILD_ONLY:-}" ]; then
  step "built (PROVE_BUILD_ONLY: the checks run on the next call)"
  exit 0
fi

step "rank_checks.exe (3 ranks) under wine: ${PROVE_TESTS:-tests/test_cpp_ranks.py tests/windows}"
# PROVE_TESTS: what pytest runs here (CI leaves out tests/windows, which its README test run ran).
# shellcheck disable=SC2086
CYXWIZ_RANK_CHECKS_PREFIX=wine CYXWIZ_RANK_CHECKS="$out/tests_cpp/rank_checks.exe" \
  "$PYTHON" -m pytest -q -p no:cacheprovider ${PROVE_TESTS:-tests/test_cpp_ranks.py tests/windows}

# Runs N ranks of a Windows program in the background; waits for all; fails if any fails.
ranks() {
  local n="$1" port="$2" log="$3"; shift 3
  local pids=() r rc=0
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 wine "$@" >"$log.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || { rc=1; echo "rank $r failed:"; cat "$log.$r"; }; done
  return $rc
}
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step "examples/cpp: 2 ranks"
ranks 2 "$(free_port)" "$out/example.log" "$out/examples_cpp/ddp_example.exe"
cat "$out/example.log.0"
"$PYTHON" - "$out/example.log.0" <<'PY'
import re, sys
losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", open(sys.argv[1]).read())]
assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0], f"the example's loss did not fall: {losses}"
PY

step "allreduce_bench.exe: 3 ranks, file mapping and TCP"
: >"$out/allreduce_wine.txt"
for transport in shm tcp; do
  CYXWIZ_TRANSPORT=$transport ranks 3 "$(free_port)" "$out/bench_$transport.log" "$out/tests_cpp/allreduce_bench.exe" 0.3
  cat "$out/bench_$transport.log.0" >>"$out/allreduce_wine.txt"
done
echo "transport ranks bytes median_us busbw_GBps (under Wine)"
cat "$out/allreduce_wine.txt"
step "passed"
