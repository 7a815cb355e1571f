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
// out[j] += sum_r g[r, j].
void addColumnSums(const Device& device, const float* g, float* out, int64_t rows, int64_t cols);

// y = f(x) on the GPU for a CUDA tensor; CPU tensors take `cpu` (the module's own formula).
template <typename F>
Tensor activation(const Tensor& x, cuda::Activation f, F cpu);
// dx = g f'(x) on the GPU for CUDA tensors; CPU tensors take `cpu(x, g)`.
template <typename F>
Tensor activationGrad(const Tensor& x, const Tensor& g, cuda::Activation f, F cpu);

// ---- implementation ----
void gpuActivation(const Tensor& x, Tensor& y, cuda::Activation f);
void gpuActivationGrad(const Tensor& x, const Tensor& g, Tensor& dx, cuda::Activation f);

template <typename F>
Tensor activation(const Tensor& x, cuda::Activation f, F cpu) {
  Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
  if (x.isCuda()) {
    gpuActivation(x, y, f);
    return y;
  }
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = cpu(in[i]);
  return y;
}

template <typename F>
Tensor activationGrad(const Tensor& x, const Tensor& g, cuda::Activation f, F cpu) {
  Tensor dx = Tensor::empty(g.shape(), DType::Float32, g.device());
  if (g.isCuda()) {
    gpuActivationGrad(x, g, dx, f);
    return dx;
  }
  const float* in = x.data<float>();
  const float* gr = g.data<float>();
  float* out = dx.data<float>();
  const int64_t n = g.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = cpu(in[i], gr[i]);
  return dx;
}

// Throws unless both tensors are on the same device; `who` names the caller.
void requireSameDevice(const Tensor& a, const Tensor& b, const char* who);

}  // namespace cyxwiz::ops
