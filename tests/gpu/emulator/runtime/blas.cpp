// TEST DOUBLE, NOT GPU SUPPORT. cuBLAS on the host: handles (bound to the device current at
// cublasCreate), their stream, workspace, pointer mode and math mode, and cublasSgemm(_64) and
// cublasSgemmStridedBatched_64 (one item, the batch's products in order, every matrix's range checked) with
// cuBLAS's argument checks (CUBLAS_STATUS_INVALID_VALUE, with an "emulator:" line saying which) and
// column-major semantics: C = alpha op(A) op(B) + beta C, C not read when beta == 0, A and B not read
// when alpha == 0 or k == 0. The product accumulates in float in k order (the GPU's order differs, by
// tiles and split-k, so the last bits may too); CUBLAS_TF32_TENSOR_OP_MATH rounds the inputs to TF32
// (10-bit mantissa) first, as tensor cores do. The GEMM is queued on the handle's stream like any
// kernel: its ranges are checked when it runs (host or freed pointers: illegal address).
#include <algorithm>
#include <cstring>
#include <string>

#include <cublas_v2.h>

#include "internal.h"

struct cublasContext {
  int dev = 0;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspaceBytes = 0;
  cublasPointerMode_t pointerMode = CUBLAS_POINTER_MODE_HOST;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace cxemu {

namespace {

float tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // round to nearest (ties away), finite values only
  u &= 0xffffe000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

}  // namespace

size_t matrixBytes(int64_t rows, int64_t cols, int64_t ld) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>((cols - 1) * ld + rows) * sizeof(float);
}

void gemmHost(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, const float* c, int64_t ldc, float* d, int64_t ldd, bool useTf32) {
  const bool product = alpha != 0.0f && k > 0;
  std::vector<float> pa(product ? static_cast<size_t>(m * k) : 0);  // op(A), packed column-major
  if (product) {
    for (int64_t l = 0; l < k; ++l) {
      for (int64_t i = 0; i < m; ++i) {
        const float v = transA ? a[l + i * lda] : a[i + l * lda];
        pa[static_cast<size_t>(i + l * m)] = useTf32 ? tf32(v) : v;
      }
    }
  }
  std::vector<float> acc(static_cast<size_t>(m));
  for (int64_t j = 0; j < n; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    if (product) {
      for (int64_t l = 0; l < k; ++l) {
        float bv = transB ? b[j + l * ldb] : b[l + j * ldb];
        if (useTf32) bv = tf32(bv);
        const float* col = &pa[static_cast<size_t>(l * m)];
        for (int64_t i = 0; i < m; ++i) acc[i] += col[i] * bv;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const float r = product ? alpha * acc[i] : 0.0f;
      d[i + j * ldd] = beta == 0.0f ? r : r + beta * c[i + j * ldc];
    }
  }
}

}  // namespace cxemu

namespace cxemu {

// cublasSgemm(_64) and cublasSgemmStridedBatched_64: `batch` products, matrix i at X + i * strideX.
cublasStatus_t sgemmBatched(const char* name, cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int64_t m, int64_t n, int64_t k, const float* alpha,
                            const float* A, int64_t lda, long long strideA, const float* B, int64_t ldb,
                            long long strideB, const float* beta, float* C, int64_t ldc, long long strideC,
                            int64_t batch) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto invalid = [&](const std::string& why) {
    say(std::string(name) + " on cuda:" + std::to_string(handle->dev) + ": " + why);
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  auto opOk = [](cublasOperation_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C; };
  if (!opOk(transa) || !opOk(transb)) return invalid("transa/transb is not CUBLAS_OP_N, _T or _C");
  if (m < 0 || n < 0 || k < 0) return invalid("m, n or k is negative");
  if (batch < 0) return invalid("batchCount is negative");
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int64_t needA = std::max<int64_t>(1, ta ? k : m), needB = std::max<int64_t>(1, tb ? n : k);
  const int64_t needC = std::max<int64_t>(1, m);
  if (lda < needA) return invalid("lda=" + std::to_string(lda) + " < " + std::to_string(needA));
  if (ldb < needB) return invalid("ldb=" + std::to_string(ldb) + " < " + std::to_string(needB));
  if (ldc < needC) return invalid("ldc=" + std::to_string(ldc) + " < " + std::to_string(needC));
  if (!alpha || !beta) return invalid("alpha or beta is null");
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(handle->stream, &err);
  if (!s) return invalid(std::string("the handle's stream: ") + cudaGetErrorString(err));
  const bool useTf32 = (handle->math & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == CUBLAS_TF32_TENSOR_OP_MATH;
  Item item;
  item.what = name;
  const bool hostScalars = handle->pointerMode == CUBLAS_POINTER_MODE_HOST;
  const float a0 = hostScalars ? *alpha : 0.0f, b0 = hostScalars ? *beta : 0.0f;
  if (hostScalars) {
    if ((a0 == 0.0f || k == 0) && b0 == 1.0f) return CUBLAS_STATUS_SUCCESS;  // nothing to do
  } else {
    item.accesses.push_back({alpha, sizeof(float), false});
    item.accesses.push_back({beta, sizeof(float), false});
  }
  for (int64_t i = 0; i < batch; ++i) {
    if (k > 0 && (!hostScalars || a0 != 0.0f)) {
      item.accesses.push_back({A + i * strideA, matrixBytes(ta ? k : m, ta ? m : k, lda), false});
      item.accesses.push_back({B + i * strideB, matrixBytes(tb ? n : k, tb ? k : n, ldb), false});
    }
    item.accesses.push_back({C + i * strideC, matrixBytes(m, n, ldc), true});
  }
  item.fn = [=] {
    const float al = hostScalars ? a0 : *alpha, be = hostScalars ? b0 : *beta;
    for (int64_t i = 0; i < batch; ++i) {
      float* c = C + i * strideC;
      gemmHost(ta, tb, m, n, k, al, A + i * strideA, lda, B + i * strideB, ldb, be, c, ldc, c, ldc, useTf32);
    }
  };
  return launchItem(s, std::move(item), true) == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = nullptr;
  const int dev = currentDevice();
  if (deviceError(dev) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stickyError(dev) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto* h = new cublasContext;
  h->dev = dev;
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;  // queued GEMMs captured their arguments, not the handle
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!version) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  handle->workspace = nullptr;  // cuBLAS: setting the stream resets the workspace to the default one
  handle->workspaceBytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!streamId) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (workspaceSizeInBytes && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->workspace = workspace;
  handle->workspaceBytes = workspaceSizeInBytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
  handle->pointerMode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointerMode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
  }
  return "unknown error";
}

cublasStatus_t cublasSgemm_v2_64(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m,
                                 int64_t n, int64_t k, const float* alpha, const float* A, int64_t lda,
                                 const float* B, int64_t ldb, const float* beta, float* C, int64_t ldc) {
  return sgemmBatched("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched_64(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                            int64_t m, int64_t n, int64_t k, const float* alpha, const float* A,
                                            int64_t lda, long long int strideA, const float* B, int64_t ldb,
                                            long long int strideB, const float* beta, float* C, int64_t ldc,
                                            long long int strideC, int64_t batchCount) {
  return sgemmBatched("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb,
                      strideB, beta, C, ldc, strideC, batchCount);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc) {
  return cublasSgemm_v2_64(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // extern "C"
