// A linear layer's forward, y = x w^T (+ bias) (then ReLU), as one cuBLASLt matmul whose epilogue
// adds the bias and applies the ReLU, instead of a bias broadcast, a GEMM and a ReLU kernel.
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
// environment variable CYXWIZ_CUBLASLT=0 (read once) forces that path everywhere.
#include <cublasLt.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
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

// What the heuristic's answer depends on: the shape, the epilogue, the compute type and the
// pointers' alignments (the preferences for A..D, and the bias pointer's value, which
// cublasLtMatmulAlgoGetHeuristic reads "to determine expected pointer alignment", cublasLt.h).
struct PlanKey {
  int dev;
  int64_t rows, in, out;
  cublasLtEpilogue_t epilogue;
  bool tf32;
  uint32_t alignX, alignW, alignY, alignBias;
  bool operator==(const PlanKey& o) const {
    return dev == o.dev && rows == o.rows && in == o.in && out == o.out && epilogue == o.epilogue &&
           tf32 == o.tf32 && alignX == o.alignX && alignW == o.alignW && alignY == o.alignY &&
           alignBias == o.alignBias;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (uint64_t v : {uint64_t(k.dev), uint64_t(k.rows), uint64_t(k.in), uint64_t(k.out), uint64_t(k.epilogue),
                       uint64_t(k.tf32), uint64_t(k.alignX), uint64_t(k.alignW), uint64_t(k.alignY),
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
  const cublasComputeType_t compute = k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&ds->op, compute, CUDA_R_32F));
  const cublasOperation_t transA = CUBLAS_OP_T, transB = CUBLAS_OP_N;
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSA, &transA, sizeof transA));
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSB, &transB, sizeof transB));
  const uint32_t epilogue = k.epilogue;  // the attribute is a uint32_t
  CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (bias) {
    // Length = rows of D (out), packed; its type defaults to D's (CUDA_R_32F) (cublasLt.h,
    // CUBLASLT_EPILOGUE_BIAS and CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
    const void* p = bias;
    CX_CUBLAS_TRY(dev, "cublasLtMatmulDescSetAttribute",
                  cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p, sizeof p));
  }
  // (rows, cols, ld) of A = w, B = x and D = y as stored, column-major (see the top of the file).
  const char* create = "cublasLtMatrixLayoutCreate";
  CX_CUBLAS_TRY(dev, create, cublasLtMatrixLayoutCreate(&ds->a, CUDA_R_32F, k.in, k.out, k.in));
  CX_CUBLAS_TRY(dev, create, cublasLtMatrixLayoutCreate(&ds->b, CUDA_R_32F, k.in, k.rows, k.in));
  CX_CUBLAS_TRY(dev, create, cublasLtMatrixLayoutCreate(&ds->d, CUDA_R_32F, k.out, k.rows, k.out));
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
  } alignments[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.alignW},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.alignX},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.alignY},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.alignY}};
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
    if (relu) CX_TRY(activationForward(dev, Activation::ReLU, y, y, rows * out));
    return {};
  };
  // Layout sizes are uint64_t but "usually only values that can be expressed as int32_t are
  // supported" (cublasLt.h, CUBLASLT_MATRIX_LAYOUT_ROWS). No alignment preference exists for the
  // bias, and PyTorch saw a chosen kernel assume 16 bytes of it and fault on less (pytorch/pytorch
  // pull request 194497): such a bias (a view at an odd offset) takes the unfused path.
  if (!ltEnabled() || in <= 0 || rows > INT32_MAX || in > INT32_MAX || out > INT32_MAX ||
      (bias && alignmentOf(bias) < 16)) {
    return unfused();
  }

  const cublasLtEpilogue_t epilogue = bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                           : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  const PlanKey key{dev, rows, in, out, epilogue, tf32Enabled(),
                    alignmentOf(x), alignmentOf(w), alignmentOf(y), bias ? alignmentOf(bias) : 0u};
  Plan plan;
  const bool known = findPlan(key, &plan);
  if (known && !plan.fused) return unfused();

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
      const float one = 1.0f, zero = 0.0f;  // host scalars: CUBLASLT_POINTER_MODE_HOST is the default
      // The workspace is cudaMalloc'd, so 256-byte aligned as cublasLtMatmul requires ("aligned to
      // at least a multiple of 256 bytes"), and no smaller than the algorithm's workspaceSize.
      st = cublasLtMatmul(s->lt, ds.op, &one, w, ds.a, x, ds.b, &zero, y, ds.d, y, ds.d, &plan.algo, s->blasWorkspace,
                          kBlasWorkspaceBytes, s->compute);
    }
  }
  if (st == CUBLAS_STATUS_SUCCESS) return {};
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) return cublasFailure("cublasLtMatmul", dev, st);
  if (plan.fused) storePlan(key, Plan{});  // the matmul refused the heuristic's algorithm: not again
  return unfused();
}

}  // namespace cyxwiz::cuda
