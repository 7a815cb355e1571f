#include "cyxwiz/tensor/blas16.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/dynlib.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/host_cache.h"
#include "cyxwiz/tensor/convert16.h"
#include "cyxwiz/tensor/dnnl.h"

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
  Provider forced = Provider::Auto;
  GemmBf16 gemm = nullptr;
  std::string info = "oneMKL not loaded (pip install mkl; CYXWIZ_MKL=0 turns it off)";
  std::map<int, Provider> chosen;        // measured, per thread count
  std::map<int, std::string> measured;   // what the measurement saw
};

State& state() {
  static State s;
  return s;
}

// The calibration: A B^T at 1024 x 1024 x 1024 (a LinearModule's forward multiplies so; large enough
// that per-call costs do not decide), each candidate timed in interleaved rounds and kept at its best,
// so that a moment of load (another thread pool still spinning) does not decide either.
constexpr int64_t kSize = 1024;
constexpr int kRounds = 3;

double secondsOf(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const char* providerName(Provider p) {
  switch (p) {
    case Provider::OneMkl: return "oneMKL";
    case Provider::OneDnn: return "oneDNN";
    case Provider::Sgemm: return "widened sgemm";
    default: return "auto";
  }
}

// Times each loaded provider and the widened-sgemm path on the same operands; the fastest wins.
Provider measure(State& s, int threads) {
  std::vector<float> af(kSize * kSize), bf(kSize * kSize), c(kSize * kSize);
  for (int64_t i = 0; i < kSize * kSize; ++i) {
    af[i] = static_cast<float>((i * 7919) % 2003) / 1001.0f - 1.0f;
    bf[i] = static_cast<float>((i * 104729) % 1999) / 999.0f - 1.0f;
  }
  std::vector<uint16_t> a16(af.size()), b16(bf.size());
  narrowFloats(af.data(), a16.data(), kSize * kSize, DType::BFloat16);
  narrowFloats(bf.data(), b16.data(), kSize * kSize, DType::BFloat16);
  std::vector<std::pair<Provider, std::function<void()>>> candidates;
  candidates.emplace_back(Provider::Sgemm, [&] {
    widenFloats(a16.data(), af.data(), kSize * kSize, DType::BFloat16);
    widenFloats(b16.data(), bf.data(), kSize * kSize, DType::BFloat16);
    blas::sgemm(false, true, kSize, kSize, kSize, 1.0f, af.data(), kSize, bf.data(), kSize, 0.0f, c.data(), kSize);
  });
  if (s.gemm) {
    candidates.emplace_back(Provider::OneMkl, [&] {
      s.gemm(kRowMajor, kNoTrans, kTrans, kSize, kSize, kSize, 1.0f, a16.data(), kSize, b16.data(), kSize, 0.0f,
             c.data(), kSize);
    });
  }
  if (dnnl::loaded() &&
      dnnl::gemmBf16(false, true, kSize, kSize, kSize, a16.data(), kSize, b16.data(), kSize, 0.0f, c.data(), kSize)) {
    candidates.emplace_back(Provider::OneDnn, [&] {
      dnnl::gemmBf16(false, true, kSize, kSize, kSize, a16.data(), kSize, b16.data(), kSize, 0.0f, c.data(), kSize);
    });
  }
  std::vector<std::pair<Provider, double>> times;
  for (auto& [p, f] : candidates) {
    f();  // warm-up: kernels built, buffers and threads made
    times.emplace_back(p, 1e30);
  }
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < candidates.size(); ++i) times[i].second = std::min(times[i].second, secondsOf(candidates[i].second));
  }
  std::pair<Provider, double> best = times.front();
  std::string seen;
  for (const auto& [p, t] : times) {
    seen += makeString(seen.empty() ? "" : ", ", providerName(p), " ", static_cast<int64_t>(2.0 * kSize * kSize * kSize / t / 1e9),
                       " GFLOP/s");
    if (t < best.second) best = {p, t};
  }
  s.measured[threads] = makeString("measured at ", threads, " thread", threads == 1 ? "" : "s", ": ", seen);
  return best.first;
}

// The provider for the current thread count.
Provider current(State& s) {
  if (s.forced != Provider::Auto) {
    if (s.forced == Provider::OneMkl && !s.gemm) return Provider::Sgemm;
    if (s.forced == Provider::OneDnn && !dnnl::loaded()) return Provider::Sgemm;
    return s.forced;
  }
  if (!s.gemm && !dnnl::loaded()) return Provider::Sgemm;
  const int threads = blas::numThreads();
  auto it = s.chosen.find(threads);
  if (it == s.chosen.end()) it = s.chosen.emplace(threads, measure(s, threads)).first;
  return it->second;
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

// C = op(A) op(B) + beta C by widening both operands to float32 for the sgemm.
void widenedGemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                 const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t aRows = transA ? K : M, aCols = transA ? M : K, bRows = transB ? N : K, bCols = transB ? K : N;
  host_cache::Scratch<float> a(aRows * aCols), b(bRows * bCols);  // every element written below
  for (int64_t r = 0; r < aRows; ++r) widenFloats(A + r * lda, a.get() + r * aCols, aCols, DType::BFloat16);
  for (int64_t r = 0; r < bRows; ++r) widenFloats(B + r * ldb, b.get() + r * bCols, bCols, DType::BFloat16);
  blas::sgemm(transA, transB, M, N, K, 1.0f, a.get(), aCols, b.get(), bCols, beta, C, ldc);
}

}  // namespace

void setLibrary(const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.gemm) return;  // a library is open for good (never closed): keep it
  s.path = path;
  s.tried = false;
  s.chosen.clear();
  s.info = path.empty() ? "oneMKL not loaded (pip install mkl; CYXWIZ_MKL=0 turns it off)" : "oneMKL not loaded yet";
}

bool available() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  return current(s) != Provider::Sgemm;
}

void setProvider(Provider provider) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.forced = provider;
}

Provider parseProvider(const std::string& name) {
  if (name == "auto") return Provider::Auto;
  if (name == "onemkl") return Provider::OneMkl;
  if (name == "onednn") return Provider::OneDnn;
  if (name == "sgemm") return Provider::Sgemm;
  throw InvalidArgument("CYXWIZ_BF16_GEMM='" + name + "': expected 'auto' (measure at the first product), 'onemkl', "
                        "'onednn' or 'sgemm'");
}

std::string info() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  const Provider p = current(s);
  std::string out = makeString(s.info, "; bfloat16 products: ", providerName(p));
  if (s.forced != Provider::Auto) return out + " (forced)";
  auto it = s.measured.find(blas::numThreads());
  return it == s.measured.end() ? out : out + " (" + it->second + ")";
}

void gemmBf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  Provider p;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    p = current(s);
  }
  CYX_CHECK(alpha == 1.0f && (beta == 0.0f || beta == 1.0f), "blas16::gemmBf16: alpha must be 1 and beta 0 or 1");
  if (M == 0 || N == 0) return;
  if (p == Provider::OneDnn && dnnl::gemmBf16(transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc)) return;
  const GemmBf16 gemm = state().gemm;  // set once, before available() first said yes
  if (!gemm || p != Provider::OneMkl) {  // oneDNN without a kernel for this shape: the widened product
    widenedGemm(transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  constexpr int64_t kMax = 0x7fffffff;
  CYX_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "blas16::gemmBf16: a dimension over 2^31-1 (oneMKL's LP64 interface)");
  gemm(kRowMajor, transA ? kTrans : kNoTrans, transB ? kTrans : kNoTrans, static_cast<int>(M), static_cast<int>(N),
       static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

}  // namespace cyxwiz::blas16
