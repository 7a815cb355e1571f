// blas_check: the Windows OpenBLAS (scipy-openblas32's win_amd64 wheel, tools/windows/fetch_openblas.sh)
// linked into a MinGW-w64 program works: scipy_cblas_sgemm on small row-major matrices, with and
// without transposes, against a naive triple loop in double precision. Run under Wine:
//   WINEPATH=<dest>/scipy_openblas32/lib wine blas_check.exe        (or the DLL beside the .exe)
// Prints one line per case and "blas_check: OK" last; exit status 0 if every case matched, 1 if not.
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

// C = A(op) * B(op), A is m x k after op, B is k x n after op; row-major storage.
bool check(int m, int n, int k, bool transA, bool transB) {
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
  std::vector<float> c(static_cast<size_t>(m) * n, -1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7 + 3) % 11) * 0.25f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 5 + 1) % 13) * 0.125f - 0.5f;
  const int lda = transA ? m : k;  // stored k x m when transposed
  const int ldb = transB ? k : n;  // stored n x k when transposed
  scipy_cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                    m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), n);
  double worst = 0.0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = 0.0;
      for (int p = 0; p < k; ++p) {
        const double x = transA ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
        const double y = transB ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
        ref += x * y;
      }
      const double err = std::fabs(ref - c[static_cast<size_t>(i) * n + j]) / (1.0 + std::fabs(ref));
      if (!(err <= worst)) worst = err;  // NaN-safe: a NaN result becomes the worst
    }
  const bool ok = worst <= 1e-5;
  std::printf("sgemm %dx%dx%d transA=%d transB=%d max_rel_err=%.3g %s\n", m, n, k, transA, transB, worst,
              ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  std::printf("OpenBLAS config: %s\n", scipy_openblas_get_config());
  std::printf("core: %s, threads: %d\n", scipy_openblas_get_corename(), scipy_openblas_get_num_threads());
  bool ok = true;
  ok = check(3, 4, 5, false, false) && ok;
  ok = check(4, 3, 2, true, false) && ok;
  ok = check(5, 5, 7, false, true) && ok;
  ok = check(64, 48, 80, true, true) && ok;  // big enough for OpenBLAS's blocked kernels
  std::printf("blas_check: %s\n", ok ? "OK" : "FAILED");
  std::fflush(stdout);
  return ok ? 0 : 1;
}
