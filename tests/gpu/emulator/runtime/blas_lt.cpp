// TEST DOUBLE, NOT GPU SUPPORT. cuBLASLt on the host: descriptors, a heuristic that offers one
// algorithm, and cublasLtMatmul: D = alpha op(A) op(B) + beta C (C not read when beta == 0), then the
// epilogue: BIAS adds bias[i] to row i of D (a vector as long as D has rows), RELU clamps at 0
// (NaN -> 0, as fmaxf), RELU_BIAS does both in that order. Emulated: float32 matrices, or A and B both
// CUDA_R_16BF or both CUDA_R_16F with C and D float32 and compute CUBLAS_COMPUTE_32F(_PEDANTIC) (the
// 16-bit values widened exactly to float32 on the host and multiplied as float32 ones: not the tensor
// cores' accumulation order), column order, no batches, compute CUBLAS_COMPUTE_32F(_PEDANTIC) or
// CUBLAS_COMPUTE_32F_FAST_TF32 (float32 inputs rounded to TF32), host scalars, the
// DEFAULT/RELU/BIAS/RELU_BIAS epilogues. Anything else:
// CUBLAS_STATUS_NOT_SUPPORTED (from the heuristic and from the matmul). Inconsistent shapes or leading
// dimensions: CUBLAS_STATUS_INVALID_VALUE with an "emulator:" line.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <cublasLt.h>

#include "cyxwiz/cuda/kernel_math.h"
#include "internal.h"

struct cublasLtContext {
  int dev = 0;
};

struct cublasLtMatmulDescOpaque_st {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  int32_t pointerMode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t biasType = -1;  // default: D's type
  bool unsupported = false;  // an attribute the emulator does not model was set
};

struct cublasLtMatrixLayoutOpaque_st {
  cudaDataType type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
};

struct cublasLtMatmulPreferenceOpaque_st {
  uint64_t maxWorkspace = 0;
};

namespace cxemu {

namespace {

constexpr uint64_t kAlgoTag = 0x43584c54454d55ull;  // the one algorithm the heuristic offers

template <class T>
cublasStatus_t setValue(T* field, const void* buf, size_t size) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

struct Shape {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false, tf32 = false;
  cudaDataType ab = CUDA_R_32F;  // A's and B's type
};

size_t elementBytes(cudaDataType t) { return t == CUDA_R_32F ? sizeof(float) : sizeof(uint16_t); }

// A column-major 16-bit matrix (rows x cols, ld) widened to float32 with the same ld: exact, with
// the kernels' own conversions (kernel_math.h).
std::vector<float> widened(const void* p, cudaDataType t, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(matrixBytes(rows, cols, ld) / sizeof(float));
  const auto* in = static_cast<const uint16_t*>(p);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t == CUDA_R_16BF ? cyxwiz::cuda::bfloat16Value(in[i]) : cyxwiz::cuda::halfValue(in[i]);
  }
  return out;
}

// What both the heuristic and the matmul check.
cublasStatus_t check(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Shape* shape) {
  if (!op || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
  auto notSupported = [](const std::string& why) {
    say("cublasLt: not emulated: " + why);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  };
  if (op->unsupported) return notSupported("a matmul descriptor attribute");
  if (op->compute != CUBLAS_COMPUTE_32F && op->compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
      op->compute != CUBLAS_COMPUTE_32F_FAST_TF32) {
    return notSupported("compute type " + std::to_string(op->compute));
  }
  if (op->scale != CUDA_R_32F || op->pointerMode != CUBLASLT_POINTER_MODE_HOST) {
    return notSupported("scale type or pointer mode");
  }
  const uint32_t e = op->epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_RELU && e != CUBLASLT_EPILOGUE_BIAS &&
      e != CUBLASLT_EPILOGUE_RELU_BIAS) {
    return notSupported("epilogue " + std::to_string(e));
  }
  if (op->biasType != -1 && op->biasType != CUDA_R_32F) return notSupported("bias type");
  for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
    if (l->order != CUBLASLT_ORDER_COL || l->batch != 1) return notSupported("a layout in another order or batched");
  }
  const bool sixteen = a->type == CUDA_R_16BF || a->type == CUDA_R_16F;
  if (!(a->type == CUDA_R_32F || sixteen) || b->type != a->type || c->type != CUDA_R_32F || d->type != CUDA_R_32F) {
    return notSupported("layout types A " + std::to_string(a->type) + ", B " + std::to_string(b->type) + ", C " +
                        std::to_string(c->type) + ", D " + std::to_string(d->type) + " (float32, or 16-bit A and B "
                        "of one type with float32 C and D)");
  }
  if (sixteen && op->compute == CUBLAS_COMPUTE_32F_FAST_TF32) return notSupported("TF32 compute with 16-bit inputs");
  auto invalid = [](const std::string& why) {
    say("cublasLtMatmul: " + why);
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  auto opOk = [](int32_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C; };
  if (!opOk(op->transa) || !opOk(op->transb) || op->transc != CUBLAS_OP_N) return invalid("bad transa/transb/transc");
  Shape s;
  s.ta = op->transa != CUBLAS_OP_N;
  s.tb = op->transb != CUBLAS_OP_N;
  s.tf32 = op->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  s.ab = a->type;
  s.m = static_cast<int64_t>(d->rows);
  s.n = static_cast<int64_t>(d->cols);
  const int64_t aRows = static_cast<int64_t>(s.ta ? a->cols : a->rows), aCols = static_cast<int64_t>(s.ta ? a->rows : a->cols);
  const int64_t bRows = static_cast<int64_t>(s.tb ? b->cols : b->rows), bCols = static_cast<int64_t>(s.tb ? b->rows : b->cols);
  s.k = aCols;
  if (aRows != s.m || bCols != s.n || bRows != s.k || c->rows != d->rows || c->cols != d->cols) {
    return invalid("shapes do not match: op(A) " + std::to_string(aRows) + "x" + std::to_string(aCols) + ", op(B) " +
                   std::to_string(bRows) + "x" + std::to_string(bCols) + ", D " + std::to_string(s.m) + "x" +
                   std::to_string(s.n));
  }
  for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
    if (l->ld < std::max<int64_t>(1, static_cast<int64_t>(l->rows))) {
      return invalid("leading dimension " + std::to_string(l->ld) + " < rows " + std::to_string(l->rows));
    }
  }
  if ((e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS) && !op->bias) {
    return invalid("a BIAS epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
  }
  *shape = s;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = nullptr;
  const int dev = currentDevice();
  if (deviceError(dev) != cudaSuccess || stickyError(dev) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto* h = new cublasLtContext;
  h->dev = dev;
  *lightHandle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new cublasLtMatmulDescOpaque_st;
  d->compute = computeType;
  d->scale = scaleType;
  *matmulDesc = d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return setValue(&d->compute, buf, size);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return setValue(&d->scale, buf, size);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return setValue(&d->pointerMode, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSA: return setValue(&d->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return setValue(&d->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSC: return setValue(&d->transc, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return setValue(&d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return setValue(&d->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return setValue(&d->biasType, buf, size);
    default:
      if (!buf) return CUBLAS_STATUS_INVALID_VALUE;
      d->unsupported = true;  // accepted, and the heuristic then offers nothing
      return CUBLAS_STATUS_SUCCESS;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new cublasLtMatrixLayoutOpaque_st;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *matLayout = l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return setValue(&l->type, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return setValue(&l->order, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return setValue(&l->rows, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return setValue(&l->cols, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_LD: return setValue(&l->ld, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return setValue(&l->batch, buf, size);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_st;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (!pref || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return setValue(&pref->maxWorkspace, buf, size);
  return CUBLAS_STATUS_SUCCESS;  // alignments and search options: the one algorithm needs none
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!preference || requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returnAlgoCount = 0;
  Shape shape;
  const cublasStatus_t st = check(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &shape);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  cublasLtMatmulHeuristicResult_t r;
  std::memset(&r, 0, sizeof r);
  r.algo.data[0] = kAlgoTag;
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  heuristicResultsArray[0] = r;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* /*workspace*/,
                              size_t /*workspaceSizeInBytes*/, cudaStream_t stream) {
  if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
  Shape s;
  const cublasStatus_t st = check(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (algo && algo->data[0] != kAlgoTag) return CUBLAS_STATUS_INVALID_VALUE;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (s.m == 0 || s.n == 0) return CUBLAS_STATUS_SUCCESS;
  cudaError_t err = cudaSuccess;
  Stream* str = resolveStream(stream, &err);
  if (!str) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const uint32_t epi = computeDesc->epilogue;
  const bool relu = epi == CUBLASLT_EPILOGUE_RELU || epi == CUBLASLT_EPILOGUE_RELU_BIAS;
  const auto* bias =
      epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_RELU_BIAS ? static_cast<const float*>(computeDesc->bias)
                                                                          : nullptr;
  const auto* c = static_cast<const float*>(C);
  auto* d = static_cast<float*>(D);
  const int64_t lda = Adesc->ld, ldb = Bdesc->ld, ldc = Cdesc->ld, ldd = Ddesc->ld;
  const int64_t aRows = int64_t(Adesc->rows), aCols = int64_t(Adesc->cols);
  const int64_t bRows = int64_t(Bdesc->rows), bCols = int64_t(Bdesc->cols);
  const size_t per = elementBytes(s.ab);  // matrixBytes counts float32 elements
  Item item;
  item.what = "cublasLtMatmul";
  if (s.k > 0 && al != 0.0f) {
    item.accesses.push_back({A, matrixBytes(aRows, aCols, lda) / sizeof(float) * per, false});
    item.accesses.push_back({B, matrixBytes(bRows, bCols, ldb) / sizeof(float) * per, false});
  }
  if (be != 0.0f) item.accesses.push_back({C, matrixBytes(s.m, s.n, ldc), false});
  item.accesses.push_back({D, matrixBytes(s.m, s.n, ldd), true});
  if (bias) item.accesses.push_back({bias, size_t(s.m) * sizeof(float), false});
  item.fn = [=] {
    const auto* a = static_cast<const float*>(A);
    const auto* b = static_cast<const float*>(B);
    std::vector<float> wa, wb;  // 16-bit A and B as float32, read when the matmul runs
    if (s.ab != CUDA_R_32F && s.k > 0 && al != 0.0f) {
      wa = widened(A, s.ab, aRows, aCols, lda);
      wb = widened(B, s.ab, bRows, bCols, ldb);
      a = wa.data();
      b = wb.data();
    }
    gemmHost(s.ta, s.tb, s.m, s.n, s.k, al, a, lda, b, ldb, be, c, ldc, d, ldd, s.tf32);
    if (!bias && !relu) return;
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t i = 0; i < s.m; ++i) {
        float& x = d[i + j * ldd];
        if (bias) x += bias[i];
        if (relu) x = std::fmax(x, 0.0f);
      }
    }
  };
  return launchItem(str, std::move(item), true) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
