#include "cyxwiz/tensor/blas16.h"

#include <mutex>

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/dynlib.h"

namespace cyxwiz::blas16 {

namespace {

// oneMKL's C interface (mkl_cblas.h, mkl_service.h); MKL_INT is 32-bit in libmkl_rt's default LP64.
using GemmBf16 = void (*)(int layout, int transA, int transB, int m, int n, int k, float alpha, const uint16_t* a,
                          int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc);
using SetThreadingLayer = int (*)(int);
using CbwrSet = int (*)(int);
using GetVersionString = void (*)(char*, int);
using DisableFastMm = int (*)();
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
constexpr int kThreadingSequential = 1;
// MKL_CBWR_AUTO | MKL_CBWR_STRICT: the best code path for this CPU, with results that do not depend
// on the arrays' alignment (a checkpointed replay, or another rank, gets the same bits).
constexpr int kCbwrAutoStrict = 0x10002;

struct State {
  std::mutex mutex;
  std::string path;
  bool tried = false;
  bool enabled = true;
  GemmBf16 gemm = nullptr;
  std::string info = "not loaded (pip install mkl; CYXWIZ_MKL=0 turns it off)";
};

State& state() {
  static State s;
  return s;
}

void open(State& s) {
  s.tried = true;
  if (s.path.empty()) return;
  std::string error;
  void* lib = platform::openLibrary(s.path, &error);
  if (!lib) {
    s.info = "could not open " + s.path + ": " + error;
    return;
  }
  auto gemm = reinterpret_cast<GemmBf16>(platform::findSymbol(lib, "cblas_gemm_bf16bf16f32"));
  auto layer = reinterpret_cast<SetThreadingLayer>(platform::findSymbol(lib, "MKL_Set_Threading_Layer"));
  auto cbwr = reinterpret_cast<CbwrSet>(platform::findSymbol(lib, "MKL_CBWR_Set"));
  auto version = reinterpret_cast<GetVersionString>(platform::findSymbol(lib, "MKL_Get_Version_String"));
  auto disableFastMm = reinterpret_cast<DisableFastMm>(platform::findSymbol(lib, "MKL_Disable_Fast_MM"));
  if (!gemm || !layer) {
    s.info = s.path + " has no cblas_gemm_bf16bf16f32 (oneMKL 2021 or later has it)";
    return;
  }
  // Sequential: one thread per call, the caller's. A second thread pool (OpenMP or TBB) beside
  // OpenBLAS's would fight it and the ranks for the cores.
  layer(kThreadingSequential);
  if (cbwr) cbwr(kCbwrAutoStrict);
  // oneMKL's own allocator would keep its packing buffers after each call (megabytes held between
  // steps, outside our accounting): freed with every call instead, as our own temporaries are.
  if (disableFastMm) disableFastMm();
  char text[256] = {0};
  if (version) version(text, sizeof text - 1);
  s.info = std::string(text[0] ? text : "oneMKL") + " (cblas_gemm_bf16bf16f32, sequential) from " + s.path;
  s.gemm = gemm;
}

}  // namespace

void setLibrary(const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.gemm) return;  // a library is open for good (never closed): keep it
  s.path = path;
  s.tried = false;
  s.info = path.empty() ? "not loaded (pip install mkl; CYXWIZ_MKL=0 turns it off)" : "not loaded yet";
}

bool available() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  return s.enabled && s.gemm;
}

void setEnabled(bool enabled) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.enabled = enabled;
}

std::string info() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  return s.enabled || !s.gemm ? s.info : s.info + "; disabled";
}

void gemmBf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmBf16 gemm = state().gemm;  // set once, before available() first said yes
  CYX_CHECK(gemm, "blas16::gemmBf16: oneMKL is not loaded");
  constexpr int64_t kMax = 0x7fffffff;
  CYX_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "blas16::gemmBf16: a dimension over 2^31-1 (oneMKL's LP64 interface)");
  if (M == 0 || N == 0) return;
  gemm(kRowMajor, transA ? kTrans : kNoTrans, transB ? kTrans : kNoTrans, static_cast<int>(M), static_cast<int>(N),
       static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

}  // namespace cyxwiz::blas16
