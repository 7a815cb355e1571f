// TEST DOUBLE, NOT GPU SUPPORT. The launch of cpp/cyxwiz/cuda/kernels_attention.cu on the host: the
// masked softmax with kernel_math.h's functions, a row's sum replayed as a block of rowThreads(cols)
// threads in the GPU's order (block.h; the maximum does not depend on the order).
#include <cmath>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "kernels/block.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::blockStridedSum;
using emulated::reads;
using emulated::writes;

void launchMaskedSoftmax(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols, bool causal) {
  cxemu::enqueue(s, "maskedSoftmaxKernel", {reads(x, rows * cols), writes(y, rows * cols)}, [=] {
    const int threads = rowThreads(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const int64_t seen = softmaxSeen(r, cols, causal);
      float mx = -INFINITY;
      for (int64_t c = 0; c < seen; ++c) mx = fmaxf(mx, xr[c]);
      const float inv = inverseSum(blockStridedSum<double>(threads, seen, [&](int64_t c) {
        const float e = softmaxNumerator(xr[c], mx);
        yr[c] = e;
        return static_cast<double>(e);
      }));
      for (int64_t c = 0; c < cols; ++c) yr[c] = c < seen ? yr[c] * inv : 0.0f;
    }
  });
}

}  // namespace cyxwiz::cuda
