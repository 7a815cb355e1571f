// Element-wise kernels: fill, bias broadcast and reduction, product, sum, activations, dropout.
// Formulas follow the CPU modules (nn/relu.cpp, gelu.cpp, sigmoid.cpp, tanh.cpp, activations.cpp,
// dropout.cpp); the
// math is kernel_math.h's, the ApiImpl methods calling these launches are in ops_elementwise.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

__global__ void fillKernel(float* dst, int64_t n, float value) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) fillElement(dst, i, value);
}

// Flat over the output, so that short rows (a small layer's bias) still fill the GPU.
__global__ void broadcastRowsKernel(const float* row, float* out, int64_t total, int64_t cols) {
  for (int64_t i = globalIndex(); i < total; i += globalStride()) broadcastRowsElement(row, out, i, cols);
}

// A 32-column tile per block; its kColumnSumRows thread rows each sum a strided subset of the rows
// (coalesced across the warp), then one thread per column adds the partials in a fixed order.
// T: the elements' type (Float32, or a 16-bit copy under autocast).
template <ElemType T>
__global__ void addColumnSumsKernel(const void* g, float* out, int64_t rows, int64_t cols) {
  __shared__ float partial[kColumnSumRows][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kColumnSumRows) sum += loadFloat<T>(g, r * cols + col);
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
  for (int64_t i = globalIndex(); i < n; i += globalStride()) multiplyElement(a, b, out, i);
}

__global__ void addKernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) addElement(a, b, out, i);
}

template <Activation F>
__global__ void activationForwardKernel(const float* x, float* y, int64_t n, float param) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) activationForwardElement<F>(x, y, i, param);
}

template <Activation F>
__global__ void activationBackwardKernel(const float* x, const float* g, float* dx, int64_t n, float param) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) activationBackwardElement<F>(x, g, dx, i, param);
}

template <Activation F>
void forward(cudaStream_t s, const float* x, float* y, int64_t n, float param) {
  activationForwardKernel<F><<<gridFor(n), kThreads, 0, s>>>(x, y, n, param);
}

template <Activation F>
void backward(cudaStream_t s, const float* x, const float* g, float* dx, int64_t n, float param) {
  activationBackwardKernel<F><<<gridFor(n), kThreads, 0, s>>>(x, g, dx, n, param);
}

__global__ void dropoutKernel(const float* x, float* y, float* mask, int64_t n, float keep, float scale,
                              uint64_t seed, const uint64_t* seedOnDevice) {
  seed = dropoutSeed(seed, seedOnDevice);
  for (int64_t i = globalIndex(); i < n; i += globalStride()) dropoutElement(x, y, mask, i, keep, scale, seed);
}

}  // namespace

void launchFill(cudaStream_t s, float* dst, int64_t n, float value) {
  fillKernel<<<gridFor(n), kThreads, 0, s>>>(dst, n, value);
}

void launchBroadcastRows(cudaStream_t s, const float* row, float* out, int64_t rows, int64_t cols) {
  broadcastRowsKernel<<<gridFor(rows * cols), kThreads, 0, s>>>(row, out, rows * cols, cols);
}

void launchAddColumnSums(cudaStream_t s, const float* g, float* out, int64_t rows, int64_t cols) {
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  addColumnSumsKernel<ElemType::Float32><<<blocks, dim3(32, kColumnSumRows), 0, s>>>(g, out, rows, cols);
}

void launchAddColumnSums16(cudaStream_t s, ElemType type, const uint16_t* g, float* out, int64_t rows, int64_t cols) {
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  if (type == ElemType::BFloat16) {
    addColumnSumsKernel<ElemType::BFloat16><<<blocks, dim3(32, kColumnSumRows), 0, s>>>(g, out, rows, cols);
  } else {
    addColumnSumsKernel<ElemType::Float16><<<blocks, dim3(32, kColumnSumRows), 0, s>>>(g, out, rows, cols);
  }
}

void launchMultiply(cudaStream_t s, const float* a, const float* b, float* out, int64_t n) {
  multiplyKernel<<<gridFor(n), kThreads, 0, s>>>(a, b, out, n);
}

void launchAdd(cudaStream_t s, const float* a, const float* b, float* out, int64_t n) {
  addKernel<<<gridFor(n), kThreads, 0, s>>>(a, b, out, n);
}

void launchActivationForward(cudaStream_t s, Activation f, const float* x, float* y, int64_t n, float param) {
  switch (f) {
    case Activation::ReLU: forward<Activation::ReLU>(s, x, y, n, param); break;
    case Activation::GELU: forward<Activation::GELU>(s, x, y, n, param); break;
    case Activation::Sigmoid: forward<Activation::Sigmoid>(s, x, y, n, param); break;
    case Activation::Tanh: forward<Activation::Tanh>(s, x, y, n, param); break;
    case Activation::LeakyReLU: forward<Activation::LeakyReLU>(s, x, y, n, param); break;
    case Activation::ELU: forward<Activation::ELU>(s, x, y, n, param); break;
    case Activation::Swish: forward<Activation::Swish>(s, x, y, n, param); break;
    case Activation::Mish: forward<Activation::Mish>(s, x, y, n, param); break;
  }
}

void launchActivationBackward(cudaStream_t s, Activation f, const float* x, const float* g, float* dx, int64_t n,
                              float param) {
  switch (f) {
    case Activation::ReLU: backward<Activation::ReLU>(s, x, g, dx, n, param); break;
    case Activation::GELU: backward<Activation::GELU>(s, x, g, dx, n, param); break;
    case Activation::Sigmoid: backward<Activation::Sigmoid>(s, x, g, dx, n, param); break;
    case Activation::Tanh: backward<Activation::Tanh>(s, x, g, dx, n, param); break;
    case Activation::LeakyReLU: backward<Activation::LeakyReLU>(s, x, g, dx, n, param); break;
    case Activation::ELU: backward<Activation::ELU>(s, x, g, dx, n, param); break;
    case Activation::Swish: backward<Activation::Swish>(s, x, g, dx, n, param); break;
    case Activation::Mish: backward<Activation::Mish>(s, x, g, dx, n, param); break;
  }
}

void launchDropout(cudaStream_t s, const float* x, float* y, float* mask, int64_t n, float keep, float scale,
                   uint64_t seed, const uint64_t* seedOnDevice) {
  dropoutKernel<<<gridFor(n), kThreads, 0, s>>>(x, y, mask, n, keep, scale, seed, seedOnDevice);
}

}  // namespace cyxwiz::cuda
