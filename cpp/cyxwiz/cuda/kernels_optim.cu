// Fused optimizer steps, the formulas of nn/sgd.cpp and nn/adam.cpp, over several parameters per
// launch: blockIdx.y picks the parameter, blockIdx.x strides through its elements. The parameters'
// pointers travel in the kernel's arguments (a by-value batch), so no table is copied to the device.
// The per-step scalars come as arguments, or from device memory (`scalars`, api.h) for a step that
// a CUDA graph replays: each thread then reads them when the kernel runs.
#include <algorithm>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

// 24 x 40 bytes: well inside the 4 KiB of kernel parameters every supported architecture allows.
constexpr int kTensorsPerLaunch = 24;

struct TensorBatch {
  OptimizerTensor t[kTensorsPerLaunch];
};

__device__ __forceinline__ int64_t elementIndex() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

// A zero buffer makes the first step buf = g, as torch's first-step rule.
__global__ void sgdKernel(TensorBatch batch, float lr, float mu, float wd, bool nesterov, const float* scalars) {
  if (scalars) lr = scalars[0];
  const OptimizerTensor t = batch.t[blockIdx.y];
  for (int64_t i = elementIndex(); i < t.n; i += globalStride()) {
    const float g = t.g[i] + wd * t.p[i];
    if (!t.m) {
      t.p[i] -= lr * g;
      continue;
    }
    const float b = mu * t.m[i] + g;
    t.m[i] = b;
    t.p[i] -= lr * (nesterov ? g + mu * b : b);
  }
}

__global__ void adamKernel(TensorBatch batch, float stepSize, float b1, float b2, float eps, float invSqrtBc2, float l2,
                           float decay, const float* scalars) {
  if (scalars) {
    stepSize = scalars[0];
    invSqrtBc2 = scalars[1];
    decay = scalars[2];
  }
  const OptimizerTensor t = batch.t[blockIdx.y];
  for (int64_t i = elementIndex(); i < t.n; i += globalStride()) {
    const float pi = t.p[i];
    const float g = t.g[i] + l2 * pi;
    const float mi = b1 * t.m[i] + (1.0f - b1) * g;
    const float vi = b2 * t.v[i] + (1.0f - b2) * g * g;
    t.m[i] = mi;
    t.v[i] = vi;
    t.p[i] = pi * decay - stepSize * mi / (sqrtf(vi) * invSqrtBc2 + eps);
  }
}

// Launches `kernel(batch, args...)` for every kTensorsPerLaunch parameters, with as many blocks in x
// as the largest of them needs.
template <class Kernel, class... Args>
Status launchBatches(int dev, const char* name, Kernel kernel, const OptimizerTensor* tensors, int count, Args... args) {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  for (int start = 0; start < count; start += kTensorsPerLaunch) {
    const int k = std::min(kTensorsPerLaunch, count - start);
    TensorBatch batch{};
    int64_t largest = 0;
    for (int j = 0; j < k; ++j) {
      batch.t[j] = tensors[start + j];
      largest = std::max(largest, batch.t[j].n);
    }
    if (largest <= 0) continue;
    kernel<<<dim3(gridFor(largest), static_cast<unsigned>(k)), kThreads, 0, s->compute>>>(batch, args...);
    CX_TRY(launchStatus(name, dev));
  }
  return {};
}

}  // namespace

Status ApiImpl::sgdStep(int dev, const OptimizerTensor* tensors, int count, float lr, float momentum,
                        float weightDecay, bool nesterov, const float* scalars) noexcept {
  return launchBatches(dev, "sgdKernel", sgdKernel, tensors, count, lr, momentum, weightDecay, nesterov, scalars);
}

Status ApiImpl::adamStep(int dev, const OptimizerTensor* tensors, int count, float stepSize, float b1, float b2,
                         float eps, float invSqrtBc2, float l2, float decay, const float* scalars) noexcept {
  return launchBatches(dev, "adamKernel", adamKernel, tensors, count, stepSize, b1, b2, eps, invSqrtBc2, l2, decay,
                       scalars);
}

}  // namespace cyxwiz::cuda
