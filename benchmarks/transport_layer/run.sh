#!/usr/bin/env bash
# Builds both programs, runs them interleaved (ours, uv, ours, uv, ... ROUNDS rounds each) and prints a
# markdown table. Arguments are passed to both programs (e.g. --links 1, --spin-us 2000, --sizes 4K,64M,
# --reps 100). See README.md.
#
#   benchmarks/transport_layer/run.sh                 # the full comparison (run it on a quiet machine)
#   benchmarks/transport_layer/run.sh --selftest      # correctness only: every byte checked, failures injected
#
# Environment: ROUNDS (3), BUILD_DIR (<this folder>/build), JOBS (compile jobs, 1),
# RUN_TIMEOUT (seconds per program run, 900), RAW (file for the raw RESULT lines).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-3}"
BUILD_DIR="${BUILD_DIR:-$here/build}"
JOBS="${JOBS:-1}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"

build() {
  if [[ ! -f "$BUILD_DIR/build.ninja" && ! -f "$BUILD_DIR/Makefile" ]]; then
    local gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    timeout 600 cmake -S "$here" -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  timeout 1200 cmake --build "$BUILD_DIR" -j "$JOBS" >/dev/null
}

# One program run under a hard timeout (the programs also kill their second process on any failure,
# and time out on their own: --timeout-s per wait, --watchdog-s per run).
run_one() {
  local impl="$1"
  shift
  timeout -k 10 "$RUN_TIMEOUT" "$BUILD_DIR/transport_$impl" --watchdog-s $((RUN_TIMEOUT - 5)) "$@"
}

selftest() {
  local fails=0
  for impl in ours uv; do
    for links in 2 1; do
      # Every byte of every exchange checked, a few exchanges per size.
      if out=$(run_one "$impl" --links "$links" --reps 5 --warmup 2 --check-all --timeout-s 30 2>&1); then
        n=$(grep -c '^RESULT .* ok=1$' <<<"$out" || true)
        echo "ok   $impl --links $links --check-all: $n sizes, every byte of every exchange as sent"
      else
        echo "FAIL $impl --links $links --check-all:"
        echo "$out"
        fails=$((fails + 1))
      fi
    done
    # The checks must catch a wrong byte, a peer that stops answering and a peer that dies.
    for inj in corrupt stall exit; do
      if out=$(run_one "$impl" --sizes 4K,256K --reps 3 --warmup 2 --timeout-s 3 --inject "$inj" 2>&1); then
        echo "FAIL $impl --inject $inj: not detected"
        fails=$((fails + 1))
      else
        echo "ok   $impl --inject $inj: detected ($(grep -m1 'rank 0' <<<"$out" || echo "$out" | tail -1))"
      fi
    done
  done
  left=$(ps -eo pid=,stat=,args= | grep "[t]ransport_\(ours\|uv\)" | grep -v " Z" || true)
  if [[ -n "$left" ]]; then
    echo "FAIL processes left behind:"
    echo "$left"
    fails=$((fails + 1))
  fi
  [[ $fails -eq 0 ]] && echo "selftest passed" || { echo "selftest: $fails failure(s)"; return 1; }
}

build
if [[ "${1:-}" == "--selftest" ]]; then
  selftest
  exit
fi

RAW="${RAW:-$BUILD_DIR/results-$(date +%Y%m%d-%H%M%S).txt}"
: >"$RAW"
echo "# $(uname -srm), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg); args: ${*:-(defaults)}" | tee -a "$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
  for impl in ours uv; do
    echo "# round $r/$ROUNDS: $impl" >&2
    if ! run_one "$impl" "$@" >>"$RAW"; then
      echo "run.sh: $impl failed in round $r (raw output: $RAW)" >&2
      exit 1
    fi
  done
done
echo "# raw results: $RAW"

# Per size and program: the median over the rounds of each round's median exchange.
awk '
  /^RESULT / {
    delete f
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    if (f["ok"] != 1 || f["full_checks"] < 2) { print "run.sh: unchecked result: " $0 > "/dev/stderr"; bad = 1 }
    key = f["bytes"]
    if (!(key in name)) { order[++nsizes] = key; name[key] = f["size"] }
    n = ++count[f["impl"], key]
    gb[f["impl"], key, n] = f["gbps"]; us[f["impl"], key, n] = f["median_us"]
    links = f["links"]; spin = f["spin_us"]
  }
  function med(impl, key, arr,    n, i, j, t, v) {
    n = count[impl, key]
    for (i = 1; i <= n; i++) v[i] = arr[impl, key, i] + 0
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    lo[impl] = v[1]; hi[impl] = v[n]
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  END {
    printf "\nlinks=%s spin_us=%s; GB/s per direction (bytes / median exchange time), median of %d rounds\n\n", links, spin, count["ours", order[1]]
    print "| size | ours GB/s | libuv GB/s | libuv/ours | ours us/exchange | libuv us/exchange | ours GB/s range | libuv GB/s range |"
    print "|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (s = 1; s <= nsizes; s++) {
      k = order[s]
      go = med("ours", k, gb); olo = lo["ours"]; ohi = hi["ours"]
      gu = med("uv", k, gb); ulo = lo["uv"]; uhi = hi["uv"]
      uo = med("ours", k, us); uu = med("uv", k, us)
      printf "| %s | %.3f | %.3f | %.2f | %.1f | %.1f | %.3f-%.3f | %.3f-%.3f |\n", name[k], go, gu, gu / go, uo, uu, olo, ohi, ulo, uhi
    }
    exit bad
  }' "$RAW"
