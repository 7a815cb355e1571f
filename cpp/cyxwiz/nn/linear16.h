// LinearModule's CPU kernels under autocast (nn/autocast.h): 16-bit operands, float32 accumulation.
//
// The BLAS multiplies float32 only (scipy-openblas32 exports no sbgemm, and this engine's CPUs may lack
// AVX512-BF16), so each 16-bit operand is widened to a float32 that holds it exactly and the GEMM
// accumulates in float32: the products and sums are those of a bf16/fp16 GEMM with float32
// accumulation, up to the order of the additions. The weight is rounded a block of rows at a time
// (about 4 MiB of float32) into a buffer the GEMM reads, and the 16-bit input is widened a block of
// rows at a time, so no float32 copy of the whole weight or input is ever held.
#pragma once

#include <cstdint>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

// y (rows, out) = widen(x16) round(w)^T (+ bias) (then ReLU); x16 (rows, in) 16-bit, w (out, in) float32.
void linearForward16(const Tensor& x16, const float* w, const float* bias, float* y, int64_t out, bool relu);
// gr (rows, out) = round(g): the gradient as the 16-bit operand of both backward products; `g`
// itself, rounded in place, when it is an engine temporary that only the caller holds.
Tensor roundGradient16(const Tensor& g, DType dtype);
// dW += gr^T widen(x16); db += column sums of gr (when db).
void linearParamGrads16(const Tensor& x16, const Tensor& gr, float* dw, float* db);
// dx (rows, in) = gr round(w).
Tensor linearInputGrad16(const Tensor& gr, const float* w, int64_t in, DType dtype);

}  // namespace cyxwiz::nn
