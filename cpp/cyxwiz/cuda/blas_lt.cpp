// cuBLASLt matmuls: a linear layer's forward, y = x w^T (+ bias) (then ReLU), as one matmul whose
// epilogue adds the bias and applies the ReLU, instead of a bias broadcast, a GEMM and a ReLU kernel,
// in float32 or (autocast) with 16-bit x and w; and the 16-bit GEMMs of autocast's backward (gemm16).
// The 16-bit matmuls take A and B as CUDA_R_16BF / CUDA_R_16F, C and D as CUDA_R_32F, compute
// CUBLAS_COMPUTE_32F: tensor-core products accumulated in float32.
//
// Layout (cuBLASLt is column-major, as cuBLAS; a row-major matrix is its column-major transpose):
//   D = y^T, out x rows, ld out        = op(A) op(B) with
//   A = w read column-major, in x out, ld in, TRANSA = T  (op(A) = w: out x in)
//   B = x read column-major, in x rows, ld in, TRANSB = N (op(B) = x^T: in x rows)
// Layouts describe the matrices as stored, before op (cublasLtMatmul: D = alpha op(A) op(B) + beta C;
// NVIDIA's LtSgemm sample sizes A's layout as transa == N ? m x k : k x m). The BIAS epilogue adds
// a vector as long as D has rows (= out) to every column of D, i.e. to every row of y: the
// per-output-feature bias. C is y with D's layout and beta = 0 (in place, as in LtSgemm).
//
// Whenever cuBLASLt offers no algorithm for a case (or in <= 0, a bias under 16 bytes of alignment,
// sizes beyond int32), the same result comes from broadcastRows + gemm + activationForward. The
// environment variable CYXWIZ_CUBLASLT=0 (read once) forces that path for float32. A 16-bit GEMM has
// no path but cuBLASLt (cuBLAS would need cublasGemmEx for the same thing): without an algorithm it
// fails, naming the shape.
#include <cublasLt.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

bool ltEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CYXWIZ_CUBLASLT");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

// The largest power of two (up to 256, the preferences' default) dividing the address.
uint32_t alignmentOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t n = 256;
  while (n > 1 && a % n != 0) n /= 2;
  return n;
}

// What the heuristic's answer depends on: the column-major problem D (m x n) = op(A) op(B) with k
// inner, its leading dimensions, the epilogue, the types and compute type and the pointers'
// alignments (the preferences for A..D, and the bias pointer's value, which
// cublasLtMatmulAlgoGetHeuristic reads "to determine expected pointer alignment", cublasLt.h).
struct PlanKey {
  int dev;
  int64_t m, n, k, lda, ldb, ldd;
  bool ta, tb;
  cublasLtEpilogue_t epilogue;
  cudaDataType_t ab;  // A's and B's type; C and D are float32
  bool tf32;
  uint32_t alignA, alignB, alignD, alignBias;
  bool operator==(const PlanKey& o) const {
    return dev == o.dev && m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldd == o.ldd &&
           ta == o.ta && tb == o.tb && epilogue == o.epilogue && ab == o.ab && tf32 == o.tf32 &&
           alignA == o.alignA && alignB == o.alignB && alignD == o.alignD && alignBias == o.alignBias;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (uint64_t v : {uint64_t(k.dev), uint64_t(k.m), uint64_t(k.n), uint64_t(k.k), uint64_t(k.lda),
                       uint64_t(k.ldb), uint64_t(k.ldd), uint64_t(k.ta), uint64_t(k.tb), uint64_t(k.epilogue),
                       uint64_t(k.ab), uint64_t(k.tf32), uint64_t(k.alignA), uint64_t(k.alignB), uint64_t(k.alignD),
                       uint64_t(k.alignBias)}) {
      h = (h ^ v) * 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Plan {
  bool fused = false;  // false: cuBLASLt has no algorithm for this key, use the unfused path
  cublasLtMatmulAlgo_t algo{};
};

// Shapes are few in training (a layer's batch and its last partial batch); the bound only stops a
// caller with ever-changing batch sizes from growing it without end.
constexpr size_t kMaxPlans = 4096;
std::mutex gPlansMutex;
std::unordered_map<PlanKey, Plan, PlanKeyHash> gPlans;

bool findPlan(const PlanKey& key, Plan* plan) {
  std::lock_guard<std::mutex> lock(gPlansMutex);
  auto it = gPlans.find(key);
  if (it == gPlans.end()) return false;
  *plan = it->second;
  return true;
}

void storePlan(const PlanKey& key, const Plan& plan) {
  std::lock_guard<std::mutex> lock(gPlansMutex);
  if (gPlans.size() >= kMaxPlans) gPlans.clear();
  gPlans[key] = plan;
}

// The descriptors of one call, destroyed on every path (they are host objects: the enqueued matmul
// no longer needs them, as LtSgemm destroys them right after cublasLtMatmul).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Status describe(int dev, const PlanKey& k, const float* bias, Descriptors* ds) {
  // TF32 applies to float32 operands only; 16-bit operands use the tensor cores anyway.
  const cublasComputeType_t compute =
      k.tf32 && k.ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&ds->op, compute, CUDA_R_32F));
  const cublasOperation_t transA = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N, transB = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSA, &transA, sizeof transA));
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSB, &transB, sizeof transB));
  const uint32_t epilogue = k.epilogue;  // the attribute is a uint32_t
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (bias) {
    // Length = rows of D, packed; its type defaults to D's (CUDA_R_32F) for 16-bit A/B too
    // (cublasLt.h, CUBLASLT_EPILOGUE_BIAS and CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
    const void* p = bias;
    CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                  cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p, sizeof p));
  }
  // (rows, cols, ld) as stored, column-major: transa == N ? m x k : k x m (NVIDIA's LtSgemm sample).
  const char* create = "cublasLtMatrixLayoutCreate";
  CX_CUBLAS_TRY(dev, create, cublasLtMatrixLayoutCreate(&ds->a, k.ab, k.ta ? k.k : k.m, k.ta ? k.m : k.k, k.lda));
  CX_CUBLAS_TRY(dev, create, cublasLtMatrixLayoutCreate(&ds->b, k.ab, k.tb ? k.n : k.k, k.tb ? k.k : k.n, k.ldb));
  CX_CUBLAS_TRY(dev, create, cublasLtMatrixLayoutCreate(&ds->d, CUDA_R_32F, k.m, k.n, k.ldd));
  return {};
}

// The heuristic's best algorithm for `k`; plan->fused stays false when it has none.
Status queryPlan(int dev, DeviceState* s, const PlanKey& k, Descriptors* ds, Plan* plan) {
  CX_CUBLAS_TRY(dev, "cublasLtMatmulPreferenceCreate", cublasLtMatmulPreferenceCreate(&ds->pref));
  const uint64_t workspace = kBlasWorkspaceBytes;
  CX_CUBLAS_TRY(dev, "cublasLtMatmulPreferenceSetAttribute",
                cublasLtMatmulPreferenceSetAttribute(ds->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof workspace));
  // The preferences default to 256-byte alignment, and an algorithm chosen under that assumption
  // may fail on less aligned buffers (views into a larger allocation): state the real ones.
  const struct {
    cublasLtMatmulPreferenceAttributes_t attr;
    uint32_t bytes;
  } alignments[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.alignA},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.alignB},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.alignD},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.alignD}};
  for (const auto& al : alignments) {
    CX_CUBLAS_TRY(dev, "cublasLtMatmulPreferenceSetAttribute",
                  cublasLtMatmulPreferenceSetAttribute(ds->pref, al.attr, &al.bytes, sizeof al.bytes));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(s->lt, ds->op, ds->a, ds->b, ds->d, ds->d, ds->pref, 1, &result, &count);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return {};  // "no heuristic function available for current configuration"
  if (st != CUBLAS_STATUS_SUCCESS) return cublasFailure("cublasLtMatmulAlgoGetHeuristic", dev, st);
  // Only a result whose state is SUCCESS is valid (cublasLtMatmulHeuristicResult_t::state).
  if (count > 0 && result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= kBlasWorkspaceBytes) {
    plan->fused = true;
    plan->algo = result.algo;
  }
  return {};
}

bool fitsInt32(std::initializer_list<int64_t> sizes) {
  for (int64_t v : sizes) {
    if (v > INT32_MAX) return false;
  }
  return true;
}

// One matmul D = alpha op(A) op(B) + beta D (C is D) with the key's epilogue, on dev's compute
// stream. *ran is false, with an empty Status, when cuBLASLt has no algorithm for the key (then or
// remembered from an earlier call): the caller takes another path.
Status ltMatmul(int dev, DeviceState* s, const PlanKey& key, const void* a, const void* b, const float* bias,
                float* d, float alpha, float beta, bool* ran) {
  *ran = false;
  Plan plan;
  const bool known = findPlan(key, &plan);
  if (known && !plan.fused) return {};
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;  // stays so when the heuristic has no algorithm
  {
    Descriptors ds;
    CX_TRY(describe(dev, key, bias, &ds));
    // No cuBLASLt guarantee for concurrent use of one handle is relied on: the device's users of
    // its library handles are serialised, as blas.cpp does for the cuBLAS handle.
    std::lock_guard<std::mutex> lock(s->mutex);
    if (!known) {
      CX_TRY(queryPlan(dev, s, key, &ds, &plan));
      storePlan(key, plan);
    }
    if (plan.fused) {
      // Host scalars (CUBLASLT_POINTER_MODE_HOST is the default). The workspace is cudaMalloc'd, so
      // 256-byte aligned as cublasLtMatmul requires ("aligned to at least a multiple of 256 bytes"),
      // and no smaller than the algorithm's workspaceSize.
      st = cublasLtMatmul(s->lt, ds.op, &alpha, a, ds.a, b, ds.b, &beta, d, ds.d, d, ds.d, &plan.algo,
                          s->blasWorkspace, kBlasWorkspaceBytes, s->compute);
    }
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    *ran = true;
    return {};
  }
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) return cublasFailure("cublasLtMatmul", dev, st);
  if (plan.fused) storePlan(key, Plan{});  // the matmul refused the heuristic's algorithm: not again
  return {};
}

// y^T (out x rows) = op(w) op(x) as a linear layer's key (see the top of the file).
PlanKey linearKey(int dev, cudaDataType_t ab, const void* x, const void* w, const float* bias, const float* y,
                  int64_t rows, int64_t in, int64_t out, bool relu) {
  const cublasLtEpilogue_t epilogue = bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                           : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  return PlanKey{dev, out, rows, in, in, in, out, true, false, epilogue, ab, tf32Enabled(),
                 alignmentOf(w), alignmentOf(x), alignmentOf(y), bias ? alignmentOf(bias) : 0u};
}

cudaDataType_t sixteenBitType(ElemType t) { return t == ElemType::BFloat16 ? CUDA_R_16BF : CUDA_R_16F; }

const char* sixteenBitName(ElemType t) { return t == ElemType::BFloat16 ? "bfloat16" : "float16"; }

Status notSixteenBit(const char* who, int dev, ElemType t) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": ElemType " + std::to_string(int(t)) +
         " is not a 16-bit float type (Float16 or BFloat16)";
}

}  // namespace

Status ApiImpl::linearForward(int dev, const float* x, const float* w, const float* bias, float* y, int64_t rows,
                              int64_t in, int64_t out, bool relu) noexcept {
  if (rows <= 0 || out <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));

  // The unfused path: the bias seeds y, the GEMM adds onto it (beta = 1; k = 0 leaves it), then ReLU
  // (activationForward's kernel is element-wise, y[i] from x[i] only, so in place is fine).
  auto unfused = [&]() -> Status {
    if (bias) CX_TRY(broadcastRows(dev, bias, y, rows, out));
    CX_TRY(gemm(dev, false, true, rows, out, in, 1.0f, x, in, w, in, bias ? 1.0f : 0.0f, y, out));
    if (relu) CX_TRY(activationForward(dev, Activation::ReLU, y, y, rows * out, 0.0f));
    return {};
  };
  // Layout sizes are uint64_t but "usually only values that can be expressed as int32_t are
  // supported" (cublasLt.h, CUBLASLT_MATRIX_LAYOUT_ROWS). No alignment preference exists for the
  // bias, and PyTorch saw a chosen kernel assume 16 bytes of it and fault on less (pytorch/pytorch
  // pull request 194497): such a bias (a view at an odd offset) takes the unfused path.
  if (!ltEnabled() || in <= 0 || !fitsInt32({rows, in, out}) || (bias && alignmentOf(bias) < 16)) return unfused();
  bool ran = false;
  CX_TRY(ltMatmul(dev, s, linearKey(dev, CUDA_R_32F, x, w, bias, y, rows, in, out, relu), w, x, bias, y, 1.0f, 0.0f,
                  &ran));
  return ran ? Status() : unfused();
}

Status ApiImpl::gemm16(int dev, ElemType type, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                       const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c,
                       int64_t ldc) noexcept {
  if (type != ElemType::BFloat16 && type != ElemType::Float16) return notSixteenBit("gemm16", dev, type);
  if (m <= 0 || n <= 0) return {};
  if (k <= 0) return gemm(dev, false, false, m, n, 0, alpha, nullptr, 1, nullptr, 1, beta, c, ldc);  // C = beta C
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const std::string shape = std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B is cuBLASLt's A (as blas.cpp).
  bool ran = false;
  if (fitsInt32({m, n, k, lda, ldb, ldc})) {
    const PlanKey key{dev, n, m, k, ldb, lda, ldc, transB, transA, CUBLASLT_EPILOGUE_DEFAULT, sixteenBitType(type),
                      false, alignmentOf(b), alignmentOf(a), alignmentOf(c), 0u};
    CX_TRY(ltMatmul(dev, s, key, b, a, nullptr, c, alpha, beta, &ran));
  }
  if (ran) return {};
  return "gemm16 on cuda:" + std::to_string(dev) + ": cuBLASLt offers no algorithm for a " + sixteenBitName(type) +
         " x " + sixteenBitName(type) + " -> float32 matmul of " + shape + " (m x n x k) on this GPU; train this "
         "model in float32 (leave autocast / mixed_precision off)";
}

Status ApiImpl::linearForward16(int dev, ElemType type, const void* x, const void* w, const float* bias, float* y,
                                int64_t rows, int64_t in, int64_t out, bool relu) noexcept {
  if (type != ElemType::BFloat16 && type != ElemType::Float16) return notSixteenBit("linearForward16", dev, type);
  if (rows <= 0 || out <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (in > 0 && fitsInt32({rows, in, out}) && !(bias && alignmentOf(bias) < 16)) {
    bool ran = false;
    CX_TRY(ltMatmul(dev, s, linearKey(dev, sixteenBitType(type), x, w, bias, y, rows, in, out, relu), w, x, bias, y,
                    1.0f, 0.0f, &ran));
    if (ran) return {};
  }
  // As linearForward's unfused path, with the 16-bit GEMM.
  if (bias) CX_TRY(broadcastRows(dev, bias, y, rows, out));
  CX_TRY(gemm16(dev, type, false, true, rows, out, in, 1.0f, x, in, w, in, bias ? 1.0f : 0.0f, y, out));
  if (relu) CX_TRY(activationForward(dev, Activation::ReLU, y, y, rows * out, 0.0f));
  return {};
}

}  // namespace cyxwiz::cuda
