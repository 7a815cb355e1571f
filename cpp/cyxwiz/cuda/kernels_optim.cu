// Fused optimizer steps over one flat parameter buffer, the formulas of nn/sgd.cpp and nn/adam.cpp.
// The per-step scalars come as arguments, or from device memory (`scalars`, api.h) for a step that
// a CUDA graph replays: each thread then reads them when the kernel runs.
#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

__global__ void sgdKernel(float* p, const float* grad, int64_t n, float lr, float wd, const float* scalars) {
  if (scalars) lr = scalars[0];
  for (int64_t i = globalIndex(); i < n; i += globalStride()) p[i] -= lr * (grad[i] + wd * p[i]);
}

// A zero buffer makes the first step buf = g, as torch's first-step rule.
__global__ void sgdMomentumKernel(float* p, const float* grad, float* buf, int64_t n, float lr, float mu, float wd,
                                  bool nesterov, const float* scalars) {
  if (scalars) lr = scalars[0];
  for (int64_t i = globalIndex(); i < n; i += globalStride()) {
    const float g = grad[i] + wd * p[i];
    const float b = mu * buf[i] + g;
    buf[i] = b;
    p[i] -= lr * (nesterov ? g + mu * b : b);
  }
}

__global__ void adamKernel(float* p, const float* grad, float* m, float* v, int64_t n, float stepSize, float b1,
                           float b2, float eps, float invSqrtBc2, float l2, float decay, const float* scalars) {
  if (scalars) {
    stepSize = scalars[0];
    invSqrtBc2 = scalars[1];
    decay = scalars[2];
  }
  for (int64_t i = globalIndex(); i < n; i += globalStride()) {
    const float pi = p[i];
    const float g = grad[i] + l2 * pi;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi * decay - stepSize * mi / (sqrtf(vi) * invSqrtBc2 + eps);
  }
}

}  // namespace

Status ApiImpl::sgdStep(int dev, float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                        float weightDecay, bool nesterov, const float* scalars) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (!buf) {
    sgdKernel<<<gridFor(n), kThreads, 0, s->compute>>>(p, g, n, lr, weightDecay, scalars);
  } else {
    sgdMomentumKernel<<<gridFor(n), kThreads, 0, s->compute>>>(p, g, buf, n, lr, momentum, weightDecay, nesterov,
                                                                          scalars);
  }
  return launchStatus("sgdKernel", dev);
}

Status ApiImpl::adamStep(int dev, float* p, const float* g, float* m, float* v, int64_t n, float stepSize, float b1,
                         float b2, float eps, float invSqrtBc2, float l2, float decay,
                         const float* scalars) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  adamKernel<<<gridFor(n), kThreads, 0, s->compute>>>(p, g, m, v, n, stepSize, b1, b2, eps, invSqrtBc2, l2, decay,
                                                                scalars);
  return launchStatus("adamKernel", dev);
}

}  // namespace cyxwiz::cuda
