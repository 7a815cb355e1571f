#!/bin/sh
# Start N ranks of a training command on this machine:
#   ./launch_distributed.sh 4 python train.py --epochs 3
# A thin wrapper over `python -m pycyxwiz.launch` (docs/launching.md). Launcher options such as
# --master-port go in LAUNCH_ARGS, e.g. LAUNCH_ARGS="--master-port 29600 --max-restarts 2".
# The interpreter that runs the launcher: $PYTHON, else python3, else python.
set -eu

usage() {
    echo "usage: $0 N command [args...]   (e.g. $0 4 python train.py)" >&2
    echo "       N: processes to start (an integer >= 1); launcher options go in LAUNCH_ARGS" >&2
    exit 2
}

[ $# -ge 2 ] || usage
case "$1" in
    '' | *[!0-9]*) usage ;;
esac
[ "$1" -ge 1 ] || usage
n=$1
shift

python=${PYTHON:-}
if [ -z "$python" ]; then
    python=$(command -v python3 || command -v python || true)
    [ -n "$python" ] || { echo "$0: no python3 or python on PATH; set PYTHON" >&2; exit 127; }
fi

set -f  # LAUNCH_ARGS is split into words, never globbed
# shellcheck disable=SC2086
exec "$python" -m pycyxwiz.launch --nproc-per-node "$n" ${LAUNCH_ARGS:-} -- "$@"
