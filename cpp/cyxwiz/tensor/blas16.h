// bfloat16 matrix products from oneMKL (cblas_gemm_bf16bf16f32: bfloat16 A and B, float32 C, AMX or
// AVX512-BF16 where the CPU has them), loaded at run time when the `mkl` wheel is installed: the CPU
// half of autocast("bfloat16") (nn/linear16.cpp) multiplies its 16-bit operands directly instead of
// widening them for OpenBLAS's sgemm. The same products, added in another order: 4.8-7.4x the sgemm's
// speed on one core of an AMX machine (benchmarks/results/gemm16_2core.md). Optional: without the
// library, or with CYXWIZ_MKL=0, the sgemm path runs as before.
#pragma once

#include <cstdint>
#include <string>

namespace cyxwiz::blas16 {

// Where oneMKL's runtime library (libmkl_rt) is; opened at the first bfloat16 product, not before
// (the Python package names the mkl wheel's copy at import). An empty path forgets it.
void setLibrary(const std::string& path);
// Whether bfloat16 products go to oneMKL: a library is set, opens, has the symbol, and is enabled.
// Opens it on the first call.
bool available();
// Tests and benchmarks: route bfloat16 products to oneMKL (true, when available) or to the sgemm path.
void setEnabled(bool enabled);
// "oneMKL <version> (cblas_gemm_bf16bf16f32, sequential)", or why not.
std::string info();

// Row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, A and B bfloat16 bits. Only when available().
void gemmBf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace cyxwiz::blas16
