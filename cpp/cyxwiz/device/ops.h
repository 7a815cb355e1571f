// Device-dispatched building blocks: the CPU kernel or the GPU one, chosen by where the data lives.
// Layers call these so that each keeps one code path for both devices.
#pragma once

#include <cstdint>

#include "cyxwiz/cuda/api.h"
#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::ops {

// C = alpha op(A) op(B) + beta C, row-major, all on `device`.
void gemm(const Device& device, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// out[r, :] = row.
void broadcastRows(const Device& device, const float* row, float* out, int64_t rows, int64_t cols);
// y = x w^T (+ bias) (then ReLU), x (rows, in), w (out, in): a linear layer's forward. One cuBLASLt
// call with a bias/ReLU epilogue on a GPU; bias broadcast, GEMM and ReLU on the CPU.
void linearForward(const Device& device, const float* x, const float* w, const float* bias, float* y, int64_t rows,
                   int64_t in, int64_t out, bool relu);
// out[j] += sum_r g[r, j].
void addColumnSums(const Device& device, const float* g, float* out, int64_t rows, int64_t cols);

// The GPU halves of the element-wise activations (nn/elementwise.h dispatches to them).
// `param`: LeakyReLU's slope or ELU's alpha (cuda::Activation).
void gpuActivation(const Tensor& x, Tensor& y, cuda::Activation f, float param = 0.0f);
void gpuActivationGrad(const Tensor& x, const Tensor& g, Tensor& dx, cuda::Activation f, float param = 0.0f);

// Throws unless both tensors are on the same device; `who` names the caller.
void requireSameDevice(const Tensor& a, const Tensor& b, const char* who);

}  // namespace cyxwiz::ops
