// bfloat16 matrix products straight from the 16-bit operands, for the CPU half of autocast("bfloat16")
// (nn/linear16.cpp), from whichever provider is fastest on this CPU: oneMKL's cblas_gemm_bf16bf16f32
// (the `mkl` wheel; AMX or AVX512-BF16 where the CPU has them; 4.8-7.4x the sgemm's speed on one core
// of an AMX machine, benchmarks/results/gemm16_2core.md) or oneDNN's matmul (the `onednn-cpu-gomp`
// wheel; vendor-neutral, what torch's CPU autocast uses), both loaded at run time. Which one is measured
// at the first bfloat16 product (per thread count) against the widened-sgemm path, and a provider is
// taken only when it beats that path: oneMKL's bf16 GEMM on a CPU without AMX (AMD EPYC) runs slower
// than float32 sgemm, and a bf16 product must never be slower than the float32 one. Without either
// library (or with CYXWIZ_MKL=0 / CYXWIZ_ONEDNN=0) the sgemm path runs as before.
#pragma once

#include <cstdint>
#include <string>

namespace cyxwiz::blas16 {

// Where oneMKL's runtime library (libmkl_rt) is; opened at the first bfloat16 product, not before
// (the Python package names the mkl wheel's copy at import). An empty path forgets it.
void setLibrary(const std::string& path);
// Whether bfloat16 products skip the sgemm path: a provider is loaded and chosen (measured, or forced).
// Opens oneMKL and measures on the first call at each thread count.
bool available();
// Who computes the bfloat16 products: Auto (the default) measures; the others force a provider (tests and
// benchmarks; a forced provider that is not loaded means the sgemm path).
enum class Provider { Auto, OneMkl, OneDnn, Sgemm };
void setProvider(Provider provider);
Provider parseProvider(const std::string& name);  // "auto", "onemkl", "onednn", "sgemm"
// "oneMKL <version> (cblas_gemm_bf16bf16f32, sequential) ...; in use: ...", or why not.
std::string info();

// Row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, A and B bfloat16 bits, alpha 1 and
// beta 0 or 1. Only when available(), from the provider it chose.
void gemmBf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace cyxwiz::blas16
