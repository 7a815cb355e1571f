#!/usr/bin/env bash
# fetch_openblas.sh DEST: the Windows (win_amd64) build of the BLAS the engine uses, for a MinGW-w64
# cross build. It downloads the win_amd64 wheel of scipy-openblas32 at the version installed in the
# Python environment (so Linux and Windows builds use the same OpenBLAS), unpacks it into DEST, and
# installs a CMake config of our own beside it (the wheel's own does not work with MinGW: see
# openblas-config.cmake). Afterwards:
#
#   DEST/scipy_openblas32/include/          cblas.h (scipy_cblas_*), lapack.h, openblas_config.h, ...
#   DEST/scipy_openblas32/lib/libscipy_openblas.dll   the BLAS (needs only KERNEL32 and the UCRT)
#   DEST/scipy_openblas32/lib/libscipy_openblas.lib   its import library (GNU ar format)
#   DEST/lib/cmake/openblas/OpenBLASConfig.cmake      target OpenBLAS::OpenBLAS, OpenBLAS_VERSION
#
#   cmake ... -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake -DOpenBLAS_DIR=DEST/lib/cmake/openblas
#
# The last line of stdout is OpenBLAS_DIR (scripts read it). Environment:
#   PYTHON                         the interpreter whose scipy-openblas32 sets the version and whose
#                                  pip downloads (default python3)
#   SCIPY_OPENBLAS32_VERSION       that version instead (no installed package needed)
#   SCIPY_OPENBLAS32_WHEEL         a win_amd64 wheel file already at hand: no download
# Running it again with DEST already holding that version does nothing (a stamp file records it).
# Exit status: 0 done, 1 failure (no download possible, bad wheel), 2 usage.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -ne 1 || -z "$1" || "$1" == -* ]]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
dest="$1"

if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
fi

version="${SCIPY_OPENBLAS32_VERSION:-}"
if [[ -z "$version" ]]; then
  if ! version="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("scipy-openblas32"))' 2>/dev/null)"; then
    echo "fetch_openblas.sh: scipy-openblas32 is not installed for $PYTHON; set SCIPY_OPENBLAS32_VERSION" >&2
    exit 1
  fi
fi

mkdir -p "$dest"
# One fetch at a time per DEST (concurrent test runs share a cache folder).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$dest/.lock"
  flock -w 600 9 || { echo "fetch_openblas.sh: $dest/.lock stayed locked" >&2; exit 1; }
fi

stamp="$dest/.scipy-openblas32-win_amd64"
config_dir="$dest/lib/cmake/openblas"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" \
      && -f "$dest/scipy_openblas32/lib/libscipy_openblas.dll" \
      && -f "$dest/scipy_openblas32/lib/libscipy_openblas.lib" ]]; then
  # Up to date; refresh our config files only (cheap, and picks up edits to them).
  cp "$here/openblas-config.cmake" "$config_dir/OpenBLASConfig.cmake"
  cp "$here/openblas-config-version.cmake" "$config_dir/OpenBLASConfigVersion.cmake"
  echo "scipy-openblas32 $version (win_amd64) already in $dest" >&2
  (cd "$config_dir" && pwd)
  exit 0
fi

work="$(mktemp -d "$dest/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

wheel="${SCIPY_OPENBLAS32_WHEEL:-}"
if [[ -n "$wheel" && "$(basename "$wheel")" != scipy_openblas32-"$version"-*win_amd64.whl ]]; then
  echo "fetch_openblas.sh: $wheel is not the win_amd64 wheel of scipy-openblas32 $version" >&2
  exit 1
fi
if [[ -z "$wheel" ]]; then
  echo "downloading scipy-openblas32==$version for win_amd64" >&2
  if ! timeout 300 "$PYTHON" -m pip download --quiet --disable-pip-version-check \
        --only-binary=:all: --platform win_amd64 --no-deps \
        "scipy-openblas32==$version" -d "$work/wheel" >&2; then
    echo "fetch_openblas.sh: pip download of scipy-openblas32==$version (win_amd64) failed" >&2
    exit 1
  fi
  wheel="$(ls "$work"/wheel/scipy_openblas32-*win_amd64.whl 2>/dev/null | head -n 1 || true)"
  if [[ -z "$wheel" ]]; then
    echo "fetch_openblas.sh: pip did not produce a win_amd64 wheel" >&2
    exit 1
  fi
fi

# Unpack beside, then swap in: an interrupted run never leaves a half-written DEST/scipy_openblas32.
"$PYTHON" -m zipfile -e "$wheel" "$work/unpacked"
for f in lib/libscipy_openblas.dll lib/libscipy_openblas.lib include/cblas.h include/openblas_config.h; do
  if [[ ! -f "$work/unpacked/scipy_openblas32/$f" ]]; then
    echo "fetch_openblas.sh: $wheel has no scipy_openblas32/$f" >&2
    exit 1
  fi
done
rm -f "$stamp"
rm -rf "$dest/scipy_openblas32" "$dest"/scipy_openblas32-*.dist-info
mv "$work/unpacked/scipy_openblas32" "$dest/"
mv "$work"/unpacked/scipy_openblas32-*.dist-info "$dest/"

mkdir -p "$config_dir"
cp "$here/openblas-config.cmake" "$config_dir/OpenBLASConfig.cmake"
cp "$here/openblas-config-version.cmake" "$config_dir/OpenBLASConfigVersion.cmake"
echo "$version" > "$stamp"
echo "scipy-openblas32 $version (win_amd64) unpacked in $dest" >&2
(cd "$config_dir" && pwd)
