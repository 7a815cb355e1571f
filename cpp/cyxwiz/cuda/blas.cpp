// Row-major GEMM on cuBLAS (column-major): a row-major C is the column-major C^T, and
// C^T = op(B)^T op(A)^T, so swapping the operands (and m with n) gives the row-major product.
#include <atomic>
#include <mutex>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

std::atomic<bool> gTF32{false};

}  // namespace

bool tf32Enabled() noexcept { return gTF32.load(std::memory_order_relaxed); }

void ApiImpl::setTF32(bool enabled) noexcept { gTF32.store(enabled, std::memory_order_relaxed); }

Status ApiImpl::gemm(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) noexcept {
  if (m <= 0 || n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (k <= 0) {
    // C = beta * C (blas.cu); beta = 0 writes zeros, as BLAS, so NaNs in an uninitialised C do not survive.
    if (beta == 1.0f) return {};
    launchScaleMatrix(s->compute, c, m, n, ldc, beta);
    return launchStatus("scaleMatrixKernel", dev);
  }
  // Off: CUBLAS_DEFAULT_MATH, which promises compute and intermediate precision with at least
  // FP32's mantissa and exponent bits, so never TF32 (and setting it on every call overrides any
  // default math mode an environment variable may have given the handle). CUBLAS_PEDANTIC_MATH
  // would also be plain FP32 but is meant for debugging and may select slower kernels.
  const cublasMath_t mode = tf32Enabled() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
  std::lock_guard<std::mutex> lock(s->mutex);  // the math mode belongs to the shared handle
  CX_CUBLAS_TRY(dev, "cublasSetMathMode", cublasSetMathMode(s->blas, mode));
  // 64-bit sizes: no overflow for large layers or batches.
  CX_CUBLAS_TRY(dev, "cublasSgemm",
                cublasSgemm_64(s->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                               &alpha, b, ldb, a, lda, &beta, c, ldc));
  return {};
}

Status ApiImpl::gemmStridedBatched(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float* a, int64_t lda, int64_t strideA, const float* b, int64_t ldb,
                                   int64_t strideB, float beta, float* c, int64_t ldc, int64_t strideC,
                                   int64_t batch) noexcept {
  if (m <= 0 || n <= 0 || batch <= 0) return {};
  if (k <= 0) {
    // No product: C_i = beta C_i, one gemm each (rare: attention never has k = 0 past its shape checks).
    for (int64_t i = 0; i < batch; ++i) CX_TRY(gemm(dev, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta,
                                                   c + i * strideC, ldc));
    return {};
  }
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const cublasMath_t mode = tf32Enabled() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
  std::lock_guard<std::mutex> lock(s->mutex);
  CX_CUBLAS_TRY(dev, "cublasSetMathMode", cublasSetMathMode(s->blas, mode));
  // Row-major as gemm: operands swapped, and with them their strides.
  CX_CUBLAS_TRY(dev, "cublasSgemmStridedBatched",
                cublasSgemmStridedBatched_64(s->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             transA ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, strideB, a,
                                             lda, strideA, &beta, c, ldc, strideC, batch));
  return {};
}

}  // namespace cyxwiz::cuda
