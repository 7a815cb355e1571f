#include "cyxwiz/tensor/blas.h"

#include <cblas.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "cyxwiz/common/env.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz::blas {

void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // scipy-openblas32 uses 32-bit indices.
  CYX_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "matrix product of ", M, "x", K, " by ", K, "x", N,
            " is too large for 32-bit BLAS indices; split the batch");
  if (M == 0 || N == 0) return;
  scipy_cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                    static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
                    static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

int numThreads() { return scipy_openblas_get_num_threads(); }

void setNumThreads(int n) {
  CYX_CHECK(n >= 1, "number of threads must be >= 1, got ", n);
  scipy_openblas_set_num_threads(n);
}

namespace {

bool envSet(const char* name) {
  const std::optional<std::string> value = envString(name);
  return value && !value->empty();
}

}  // namespace

std::string configureThreadsFromEnvironment() {
  if (int n = static_cast<int>(envInt("CYXWIZ_NUM_THREADS", 0, 1, 4096, "a number of threads, 1..4096; unset it for the default"))) {
    setNumThreads(n);
    return makeString("BLAS threads: ", n, " (CYXWIZ_NUM_THREADS)");
  }
  if (envSet("OPENBLAS_NUM_THREADS") || envSet("OMP_NUM_THREADS")) {
    return makeString("BLAS threads: ", numThreads(), " (OPENBLAS_NUM_THREADS/OMP_NUM_THREADS)");
  }
  const char* worldVars[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  for (const char* var : worldVars) {
    // Only a hint here: a bad value is refused by init(), which names it.
    const std::optional<std::string> value = envString(var);
    const std::optional<int64_t> ranks = value ? parseInteger(*value) : std::nullopt;
    if (ranks && *ranks > 1) {
      setNumThreads(1);
      return makeString("BLAS threads: 1 per rank (", var, "=", *value, "; override with CYXWIZ_NUM_THREADS)");
    }
  }
  return makeString("BLAS threads: ", numThreads(), " (single process: all cores)");
}

std::string libraryInfo() {
  return makeString("OpenBLAS ", CYXWIZ_BLAS_VERSION, " (scipy-openblas32, core ", scipy_openblas_get_corename(), ")");
}

}  // namespace cyxwiz::blas
