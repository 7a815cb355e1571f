// Thread indexing and block reductions shared by the kernels (nvcc only). The launch sizing is in
// launch.h and the per-element math in kernel_math.h, which the host emulator shares; the emulator
// replays these reductions' order on the host (tests/gpu/emulator/kernels/block.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

__device__ __forceinline__ int64_t globalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t globalStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

template <class T>
__device__ __forceinline__ T warpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32. The order is
// fixed by the thread layout, so a given launch configuration always gives the same bits.
template <class T>
__device__ T blockSum(T v) {
  __shared__ T shared[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warpSum(v);
  __syncthreads();  // the previous call's readers of shared[32] are done
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : T(0);
    v = warpSum(v);
    if (lane == 0) shared[32] = v;
  }
  __syncthreads();
  return shared[32];
}

__device__ inline float blockMax(float v) {
  __shared__ float shared[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : -INFINITY;
    v = warpMax(v);
    if (lane == 0) shared[32] = v;
  }
  __syncthreads();
  return shared[32];
}

// The first maximum of a row (kernel_math.h's better), NaNs skipped, 0 when all are NaN.
__device__ inline int64_t blockArgMax(const float* row, int64_t cols) {
  __shared__ float sv[33];
  __shared__ int64_t si[33];
  ArgMax best = noArgMax();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) best = better(best, ArgMax{row[c], c});
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax other{__shfl_down_sync(0xffffffffu, best.value, o), __shfl_down_sync(0xffffffffu, best.index, o)};
    best = better(best, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = best.value;
    si[warp] = best.index;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < warps ? ArgMax{sv[lane], si[lane]} : noArgMax();
    for (int o = 16; o > 0; o >>= 1) {
      ArgMax other{__shfl_down_sync(0xffffffffu, best.value, o), __shfl_down_sync(0xffffffffu, best.index, o)};
      best = better(best, other);
    }
    if (lane == 0) si[32] = argMaxIndex(best);
  }
  __syncthreads();
  return si[32];
}

}  // namespace cyxwiz::cuda
