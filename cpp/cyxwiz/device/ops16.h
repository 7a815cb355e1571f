// The GPU halves of autocast (nn/autocast.h, nn/linear.cpp, nn/relu.cpp) and of the GradScaler's
// unscale: thin calls of the CUDA library's mixed-precision entry points on device tensors. The CPU
// halves are nn/linear16.cpp, cyxwiz/tensor/convert16.h and nn/grad_scaler.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::ops {

// A new 16-bit (dtype: Float16 or BFloat16) tensor on x's device holding round(x), x float32 on a GPU.
Tensor narrowOnDevice(const Tensor& x, DType dtype);
// x (float32 on a GPU) in place: each element rounded to the nearest value of dtype (a 16-bit copy and
// back), as cyxwiz::roundFloats does on the host.
void roundOnDevice(Tensor& x, DType dtype);
// y (rows, out) float32 = x16 w16^T (+ bias) (then ReLU); x16 (rows, in), w16 (out, in) of one 16-bit type.
void linearForward16(const Tensor& x16, const Tensor& w16, const float* bias, Tensor& y, bool relu);
// C (float32) = alpha op(A) op(B) + beta C, row-major; A and B 16-bit of `dtype`, all on `device`.
void gemm16(const Device& device, DType dtype, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
            const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb, float beta, float* c, int64_t ldc);
// out[j] += sum_r widen(g16[r, j]).
void addColumnSums16(const Tensor& g16, float* out);
// dx = x16 > 0 ? g : 0.
void reluBackward16(const Tensor& x16, const Tensor& g, Tensor& dx);
// out = in * factor, n floats of dev's memory (in place when out == in).
void scaleOnDevice(int dev, const float* in, float* out, int64_t n, float factor);
// GradScaler's unscale on a GPU: every span (n floats of dev's memory) times `factor` in place, one
// kernel each, all marking one device flag where a result is Inf or NaN, then the flag's 4 bytes
// copied back: false when any was non-finite.
struct FloatSpan {
  float* data;
  int64_t n;
};
bool unscaleOnDevice(int dev, const std::vector<FloatSpan>& spans, float factor);

}  // namespace cyxwiz::ops
