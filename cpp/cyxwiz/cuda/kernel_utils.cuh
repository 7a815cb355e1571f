// Launch sizing and block reductions shared by the kernels (nvcc only).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace cyxwiz::cuda {

constexpr int kThreads = 256;

// Grid for a grid-stride loop over n elements: enough blocks to cover n, capped so that huge
// tensors loop instead of launching millions of blocks.
inline unsigned gridFor(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65536));
}

// Threads per block for one-block-per-row kernels: a warp for short rows, up to kThreads.
inline int rowThreads(int64_t cols) {
  int t = 32;
  while (t < kThreads && t < cols) t *= 2;
  return t;
}

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

// Argmax keeping the first maximum, as std::max_element (NaNs never win here, whereas
// std::max_element keeps a NaN found in first position).
struct ArgMax {
  float value;
  int64_t index;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ inline int64_t blockArgMax(const float* row, int64_t cols) {
  __shared__ float sv[33];
  __shared__ int64_t si[33];
  ArgMax best{-INFINITY, INT64_MAX};
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
    best = lane < warps ? ArgMax{sv[lane], si[lane]} : ArgMax{-INFINITY, INT64_MAX};
    for (int o = 16; o > 0; o >>= 1) {
      ArgMax other{__shfl_down_sync(0xffffffffu, best.value, o), __shfl_down_sync(0xffffffffu, best.index, o)};
      best = better(best, other);
    }
    if (lane == 0) si[32] = best.index == INT64_MAX ? 0 : best.index;  // all NaN: index 0, as the CPU
  }
  __syncthreads();
  return si[32];
}

}  // namespace cyxwiz::cuda
