// Element-wise kernels: fill, bias broadcast and reduction, product, activations, dropout.
// Formulas follow the CPU modules (nn/relu.cpp, gelu.cpp, sigmoid.cpp, tanh.cpp, dropout.cpp).
#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

__global__ void fillKernel(float* dst, int64_t n, float value) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) dst[i] = value;
}

// Flat over the output, so that short rows (a small layer's bias) still fill the GPU.
__global__ void broadcastRowsKernel(const float* row, float* out, int64_t total, int64_t cols) {
  for (int64_t i = globalIndex(); i < total; i += globalStride()) out[i] = row[i % cols];
}

// A 32-column tile per block; its kColumnSumRows thread rows each sum a strided subset of the rows
// (coalesced across the warp), then one thread per column adds the partials in a fixed order.
constexpr int kColumnSumRows = 16;

__global__ void addColumnSumsKernel(const float* g, float* out, int64_t rows, int64_t cols) {
  __shared__ float partial[kColumnSumRows][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kColumnSumRows) sum += g[r * cols + col];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int i = 0; i < kColumnSumRows; ++i) total += partial[i][threadIdx.x];
    out[col] += total;
  }
}

__global__ void multiplyKernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) out[i] = a[i] * b[i];
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// Branch on the sign so exp never overflows.
__device__ __forceinline__ float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

template <Activation F>
__device__ __forceinline__ float activate(float x) {
  if constexpr (F == Activation::ReLU) return x > 0.0f ? x : 0.0f;
  if constexpr (F == Activation::GELU) return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  if constexpr (F == Activation::Sigmoid) return sigmoid(x);
  if constexpr (F == Activation::Tanh) return tanhf(x);
  return x;
}

// g * f'(x), f' at the layer input x.
template <Activation F>
__device__ __forceinline__ float activateGrad(float x, float g) {
  if constexpr (F == Activation::ReLU) return x > 0.0f ? g : 0.0f;
  if constexpr (F == Activation::GELU) {
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return g * (cdf + x * pdf);
  }
  if constexpr (F == Activation::Sigmoid) {
    const float y = sigmoid(x);
    return g * y * (1.0f - y);
  }
  if constexpr (F == Activation::Tanh) {
    const float y = tanhf(x);
    return g * (1.0f - y * y);
  }
  return g;
}

template <Activation F>
__global__ void activationForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) y[i] = activate<F>(x[i]);
}

template <Activation F>
__global__ void activationBackwardKernel(const float* x, const float* g, float* dx, int64_t n) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) dx[i] = activateGrad<F>(x[i], g[i]);
}

// Output i of the splitmix64 generator seeded with `seed`: a counter-based stream, so element i's
// draw depends only on (seed, i), whatever the launch configuration.
__device__ __forceinline__ uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void dropoutKernel(const float* x, float* y, float* mask, int64_t n, float keep, float scale,
                              uint64_t seed, const uint64_t* seedOnDevice) {
  if (seedOnDevice) seed = *seedOnDevice;
  for (int64_t i = globalIndex(); i < n; i += globalStride()) {
    // The top 24 bits, as cyxwiz::uniform01: exactly representable floats in [0, 1).
    const float u = static_cast<float>(splitmix64(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    const float m = u < keep ? scale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

Status unknownActivation(const char* who, int dev, Activation f) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": unknown Activation " + std::to_string(int(f));
}

}  // namespace

Status ApiImpl::fill(int dev, float* dst, int64_t n, float value) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  fillKernel<<<gridFor(n), kThreads, 0, s->compute>>>(dst, n, value);
  return launchStatus("fillKernel", dev);
}

Status ApiImpl::broadcastRows(int dev, const float* row, float* out, int64_t rows, int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  broadcastRowsKernel<<<gridFor(rows * cols), kThreads, 0, s->compute>>>(row, out, rows * cols, cols);
  return launchStatus("broadcastRowsKernel", dev);
}

Status ApiImpl::addColumnSums(int dev, const float* g, float* out, int64_t rows, int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  addColumnSumsKernel<<<blocks, dim3(32, kColumnSumRows), 0, s->compute>>>(g, out, rows, cols);
  return launchStatus("addColumnSumsKernel", dev);
}

Status ApiImpl::multiply(int dev, const float* a, const float* b, float* out, int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  multiplyKernel<<<gridFor(n), kThreads, 0, s->compute>>>(a, b, out, n);
  return launchStatus("multiplyKernel", dev);
}

Status ApiImpl::activationForward(int dev, Activation f, const float* x, float* y, int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const unsigned grid = gridFor(n);
  switch (f) {
    case Activation::ReLU: activationForwardKernel<Activation::ReLU><<<grid, kThreads, 0, s->compute>>>(x, y, n); break;
    case Activation::GELU: activationForwardKernel<Activation::GELU><<<grid, kThreads, 0, s->compute>>>(x, y, n); break;
    case Activation::Sigmoid:
      activationForwardKernel<Activation::Sigmoid><<<grid, kThreads, 0, s->compute>>>(x, y, n);
      break;
    case Activation::Tanh: activationForwardKernel<Activation::Tanh><<<grid, kThreads, 0, s->compute>>>(x, y, n); break;
    default: return unknownActivation("activationForward", dev, f);
  }
  return launchStatus("activationForwardKernel", dev);
}

Status ApiImpl::activationBackward(int dev, Activation f, const float* x, const float* g, float* dx,
                                   int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const unsigned grid = gridFor(n);
  switch (f) {
    case Activation::ReLU:
      activationBackwardKernel<Activation::ReLU><<<grid, kThreads, 0, s->compute>>>(x, g, dx, n);
      break;
    case Activation::GELU:
      activationBackwardKernel<Activation::GELU><<<grid, kThreads, 0, s->compute>>>(x, g, dx, n);
      break;
    case Activation::Sigmoid:
      activationBackwardKernel<Activation::Sigmoid><<<grid, kThreads, 0, s->compute>>>(x, g, dx, n);
      break;
    case Activation::Tanh:
      activationBackwardKernel<Activation::Tanh><<<grid, kThreads, 0, s->compute>>>(x, g, dx, n);
      break;
    default: return unknownActivation("activationBackward", dev, f);
  }
  return launchStatus("activationBackwardKernel", dev);
}

Status ApiImpl::dropoutForward(int dev, const float* x, float* y, float* mask, int64_t n, float keep,
                               uint64_t seed, const uint64_t* seedOnDevice) noexcept {
  if (!(keep > 0.0f && keep <= 1.0f)) {
    return "dropoutForward on cuda:" + std::to_string(dev) + ": keep probability " + std::to_string(keep) +
           " is outside (0, 1]";
  }
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  dropoutKernel<<<gridFor(n), kThreads, 0, s->compute>>>(x, y, mask, n, keep, 1.0f / keep, seed,
                                                         seedOnDevice);
  return launchStatus("dropoutKernel", dev);
}

}  // namespace cyxwiz::cuda
