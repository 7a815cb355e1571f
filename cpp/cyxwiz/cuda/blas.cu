// The one kernel of the GEMM path (blas.cpp): C = beta * C for k = 0, which cuBLAS would reject
// (its leading-dimension checks need k >= 1).
#include <algorithm>

#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

__global__ void scaleMatrixKernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  for (int64_t r = blockIdx.y; r < m; r += gridDim.y) {
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      scaleMatrixElement(c, r, j, ldc, beta);
    }
  }
}

}  // namespace

void launchScaleMatrix(cudaStream_t s, float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  const dim3 grid(gridFor(n), static_cast<unsigned>(std::min<int64_t>(m, 65535)));
  scaleMatrixKernel<<<grid, kThreads, 0, s>>>(c, m, n, ldc, beta);
}

}  // namespace cyxwiz::cuda
