// Attention's softmax over score rows with the causal mask (nn/attention.cpp's softmaxRow; its
// backward is softmaxBackward's, as masked keys have weight 0). The per-head products are cuBLAS
// strided batched GEMMs (blas.cpp); the ApiImpl method is in ops_attention.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

// One row per block; every thread reads its columns before the block's maximum is known and writes
// the same columns after, so y may be x.
__global__ void maskedSoftmaxKernel(const float* x, float* y, int64_t rows, int64_t cols, bool causal) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const int64_t seen = softmaxSeen(r, cols, causal);
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < seen; c += blockDim.x) mx = fmaxf(mx, xr[c]);
    mx = blockMax(mx);
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < seen; c += blockDim.x) {
      const float e = softmaxNumerator(xr[c], mx);
      yr[c] = e;
      sum += e;
    }
    const float inv = inverseSum(blockSum(sum));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = c < seen ? yr[c] * inv : 0.0f;
  }
}

}  // namespace

void launchMaskedSoftmax(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols, bool causal) {
  maskedSoftmaxKernel<<<gridFor(rows, 1), rowThreads(cols), 0, s>>>(x, y, rows, cols, causal);
}

}  // namespace cyxwiz::cuda
