// The matrix-product path: every GEMM in the engine goes through here to OpenBLAS (scipy-openblas32).
#pragma once

#include <cstdint>
#include <string>

namespace cyxwiz::blas {

// Row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

int numThreads();
void setNumThreads(int n);

// Thread policy, applied once at import: CYXWIZ_NUM_THREADS wins; OPENBLAS_NUM_THREADS/OMP_NUM_THREADS
// are left to OpenBLAS; otherwise one thread per rank when a multi-rank launch is detected (RANK/WORLD_SIZE,
// torchrun, Slurm, Open MPI, MPICH), so N ranks do not fight over the cores; a single process keeps them all.
// Returns a line saying what was decided.
std::string configureThreadsFromEnvironment();

std::string libraryInfo();  // "OpenBLAS 0.3.x (core Haswell, ...)"

}  // namespace cyxwiz::blas
