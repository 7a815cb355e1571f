// Helpers for the element-wise activations: each layer then states only its formula, forward and
// derivative side by side.
#pragma once

#include <string>

#include "cyxwiz/common/parallel.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

// Requires a float32 tensor with at least one dimension.
void requireFloatTensor(const Tensor& t, const std::string& who);

// Elements per thread below which a loop runs on the caller's thread alone.
constexpr int64_t kElementGrain = int64_t{1} << 15;

// out[i] = f(a[i]), a fresh float32 tensor of a's shape.
template <typename F>
Tensor mapElements(const Tensor& a, F f) {
  Tensor out = Tensor::empty(a.shape());
  const float* x = a.data<float>();
  float* y = out.data<float>();
  parallelFor(a.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = f(x[i]);
  });
  return out;
}

// out[i] = f(a[i], b[i]) for two float32 tensors of equal size.
template <typename F>
Tensor zipElements(const Tensor& a, const Tensor& b, F f) {
  Tensor out = Tensor::empty(b.shape());
  const float* x = a.data<float>();
  const float* g = b.data<float>();
  float* y = out.data<float>();
  parallelFor(b.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = f(x[i], g[i]);
  });
  return out;
}

inline Tensor activationOnGpu(const Tensor& x, cuda::Activation gpu) {
  Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
  ops::gpuActivation(x, y, gpu);
  return y;
}

// y = f(x): the GPU kernel `gpu` for a CUDA tensor, else the module's own formula `cpu`.
template <typename F>
Tensor activation(const Tensor& x, cuda::Activation gpu, F cpu) {
  return x.isCuda() ? activationOnGpu(x, gpu) : mapElements(x, cpu);
}

inline Tensor activationGradOnGpu(const Tensor& x, const Tensor& g, cuda::Activation gpu) {
  Tensor dx = Tensor::empty(g.shape(), DType::Float32, g.device());
  ops::gpuActivationGrad(x, g, dx, gpu);
  return dx;
}

// dx = g f'(x), likewise; `cpu(x, g)` is the module's derivative. On the CPU a gradient that only the
// caller holds (the temporary the next layer returned) is overwritten in place, as roundGradient16 does:
// one activation-sized buffer less at the peak of backward.

template <typename F>
Tensor activationGrad(const Tensor& x, const Tensor& g, cuda::Activation gpu, F cpu) {
  if (!g.isCuda()) {
    if (g.borrowed() || g.storage().use_count() != 1) return zipElements(x, g, cpu);
    const float* xs = x.data<float>();
    float* gs = g.data<float>();
    parallelFor(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) gs[i] = cpu(xs[i], gs[i]);
    });
    return g;
  }
  return activationGradOnGpu(x, g, gpu);
}

// As activation and activationGrad, with the CPU loops as kernels over a range of elements, so that the
// layer can clone them per instruction set (CYXWIZ_CPU_CLONES, platform/cpu.h): a formula with exp and
// a division in a per-element lambda runs at baseline x86-64 (SSE2) speed. gradInPlace(x, g, n)
// overwrites g with dx, for the gradient only the caller holds (as activationGrad does).
struct RangeKernels {
  void (*forward)(const float* x, float* y, int64_t n);
  void (*grad)(const float* x, const float* g, float* dx, int64_t n);
  void (*gradInPlace)(const float* x, float* g, int64_t n);
};

inline Tensor activation(const Tensor& x, cuda::Activation gpu, const RangeKernels& cpu) {
  if (x.isCuda()) return activationOnGpu(x, gpu);
  Tensor y = Tensor::empty(x.shape());
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  parallelFor(x.numel(), kElementGrain, [&](int64_t begin, int64_t end) { cpu.forward(xs + begin, ys + begin, end - begin); });
  return y;
}

inline Tensor activationGrad(const Tensor& x, const Tensor& g, cuda::Activation gpu, const RangeKernels& cpu) {
  if (g.isCuda()) return activationGradOnGpu(x, g, gpu);
  const float* xs = x.data<float>();
  if (g.borrowed() || g.storage().use_count() != 1) {
    Tensor dx = Tensor::empty(g.shape());
    const float* gs = g.data<float>();
    float* ds = dx.data<float>();
    parallelFor(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
      cpu.grad(xs + begin, gs + begin, ds + begin, end - begin);
    });
    return dx;
  }
  float* gs = g.data<float>();
  parallelFor(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) { cpu.gradInPlace(xs + begin, gs + begin, end - begin); });
  return g;
}

}  // namespace cyxwiz::nn
