#!/usr/bin/env bash
# Builds the host emulator of libcyxwiz_cuda.so: the library's own sources (cpp/cyxwiz/cuda/*.cpp)
# compiled against the emulated CUDA runtime, cuBLAS, cuBLASLt, cuDNN and NCCL of this folder, with the
# kernels' shared math (cpp/cyxwiz/cuda/kernel_math.h) run on the host. No CUDA needed.
# Usage: tests/gpu/emulator/build.sh [OUTPUT_DIR]   (default build/emulator); prints the library's path.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
here="$root/tests/gpu/emulator"
out="${1:-$root/build/emulator}"
mkdir -p "$out"
shopt -s nullglob
sources=("$root"/cpp/cyxwiz/cuda/*.cpp "$here"/runtime/*.cpp "$here"/nccl/*.cpp "$here"/kernels/*.cpp)
# -Iinclude first: its cuda_runtime_api.h, cublas*.h, cudnn.h and nccl.h stand in for NVIDIA's.
g++ -std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra -pthread \
  -DCYXWIZ_CUDA_ARCHITECTURES='"emulated"' -DCYXWIZ_HAVE_CUDNN=1 \
  -I"$here/include" -I"$here" -I"$root/cpp" \
  "${sources[@]}" \
  -Wl,--version-script="$here/exports.map" -Wl,--no-undefined -lrt \
  -o "$out/libcyxwiz_cuda_emulated.so"
echo "$out/libcyxwiz_cuda_emulated.so"
