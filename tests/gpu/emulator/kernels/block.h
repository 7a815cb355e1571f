// TEST DOUBLE, NOT GPU SUPPORT. Host replays of the kernels' thread layout and block reductions
// (cpp/cyxwiz/cuda/kernel_utils.cuh), in the GPU's order: thread t of a block accumulates the
// elements t, t + threads, ... in turn, then the per-thread values are added by warpSum's
// __shfl_down_sync tree, warp by warp, and warp 0 adds the warps' sums by the same tree. The sums
// therefore associate as on the GPU; what can still differ in the last bits is the math library
// (the host's expf/exp/log against CUDA's) and FMA contraction, which nvcc does and g++ does not.
// Maxima and argmaxima do not depend on the order.
#pragma once

#include <array>
#include <cstdint>

#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda::emulated {

// One value per thread of a block of at most kThreads threads.
template <class T>
using PerThread = std::array<T, kThreads>;

// Lane 0's result of warpSum over lanes[0, 32): step o adds lane l + o into lane l (lanes past 31
// never reach lane 0). Ascending l reads lane l + o before that lane is updated, as the shuffle.
template <class T>
T warpSum(T* lanes) {
  for (int o = 16; o > 0; o >>= 1) {
    for (int l = 0; l + o < 32; ++l) lanes[l] += lanes[l + o];
  }
  return lanes[0];
}

// blockSum over the first `threads` values (a multiple of 32).
template <class T>
T blockSum(PerThread<T> v, int threads) {
  std::array<T, 32> warps{};
  const int count = threads / 32;
  for (int w = 0; w < count; ++w) warps[w] = warpSum(v.data() + 32 * w);
  for (int l = count; l < 32; ++l) warps[l] = T(0);
  return warpSum(warps.data());
}

// A block of `threads` threads striding over [0, count): blockSum of each thread's sum of term(c).
template <class T, class Term>
T blockStridedSum(int threads, int64_t count, Term term) {
  PerThread<T> acc{};
  for (int t = 0; t < threads; ++t) {
    for (int64_t c = t; c < count; c += threads) acc[t] += term(c);
  }
  return blockSum(acc, threads);
}

}  // namespace cyxwiz::cuda::emulated
