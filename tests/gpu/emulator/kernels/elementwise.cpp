// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_elementwise.cu on the host:
// the same kernel_math.h functions, queued on the stream through cxemu::enqueue. Element-wise work
// does not depend on the order the elements are visited in; addColumnSums replays the GPU's order.
#include <utility>
#include <vector>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::reads;
using emulated::writes;

void launchFill(cudaStream_t s, float* dst, int64_t n, float value) {
  cxemu::enqueue(s, "fillKernel", {writes(dst, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) fillElement(dst, i, value);
  });
}

void launchBroadcastRows(cudaStream_t s, const float* row, float* out, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  cxemu::enqueue(s, "broadcastRowsKernel", {reads(row, cols), writes(out, total)}, [=] {
    for (int64_t i = 0; i < total; ++i) broadcastRowsElement(row, out, i, cols);
  });
}

namespace {

// Per column: kColumnSumRows float partials over the rows y, y + kColumnSumRows, ..., then added
// in order onto out[col], as the kernel's tile. T: the elements' type (float32 or 16-bit).
template <ElemType T, class E>
void enqueueAddColumnSums(cudaStream_t s, const E* g, float* out, int64_t rows, int64_t cols) {
  cxemu::enqueue(s, "addColumnSumsKernel", {reads(g, rows * cols), writes(out, cols)}, [=] {
    for (int64_t col = 0; col < cols; ++col) {
      float total = 0.0f;
      for (int y = 0; y < kColumnSumRows; ++y) {
        float sum = 0.0f;
        for (int64_t r = y; r < rows; r += kColumnSumRows) sum += loadFloat<T>(g, r * cols + col);
        total += sum;
      }
      out[col] += total;
    }
  });
}

}  // namespace

void launchAddColumnSums(cudaStream_t s, const float* g, float* out, int64_t rows, int64_t cols) {
  enqueueAddColumnSums<ElemType::Float32>(s, g, out, rows, cols);
}

void launchAddColumnSums16(cudaStream_t s, ElemType type, const uint16_t* g, float* out, int64_t rows, int64_t cols) {
  if (type == ElemType::BFloat16) {
    enqueueAddColumnSums<ElemType::BFloat16>(s, g, out, rows, cols);
  } else {
    enqueueAddColumnSums<ElemType::Float16>(s, g, out, rows, cols);
  }
}

void launchMultiply(cudaStream_t s, const float* a, const float* b, float* out, int64_t n) {
  cxemu::enqueue(s, "multiplyKernel", {reads(a, n), reads(b, n), writes(out, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) multiplyElement(a, b, out, i);
  });
}

void launchAdd(cudaStream_t s, const float* a, const float* b, float* out, int64_t n) {
  cxemu::enqueue(s, "addKernel", {reads(a, n), reads(b, n), writes(out, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) addElement(a, b, out, i);
  });
}

namespace {

template <Activation F>
void enqueueActivationForward(cudaStream_t s, const float* x, float* y, int64_t n, float param) {
  cxemu::enqueue(s, "activationForwardKernel", {reads(x, n), writes(y, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) activationForwardElement<F>(x, y, i, param);
  });
}

template <Activation F>
void enqueueActivationBackward(cudaStream_t s, const float* x, const float* g, float* dx, int64_t n, float param) {
  cxemu::enqueue(s, "activationBackwardKernel", {reads(x, n), reads(g, n), writes(dx, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) activationBackwardElement<F>(x, g, dx, i, param);
  });
}

}  // namespace

void launchActivationForward(cudaStream_t s, Activation f, const float* x, float* y, int64_t n, float param) {
  switch (f) {
    case Activation::ReLU: enqueueActivationForward<Activation::ReLU>(s, x, y, n, param); break;
    case Activation::GELU: enqueueActivationForward<Activation::GELU>(s, x, y, n, param); break;
    case Activation::Sigmoid: enqueueActivationForward<Activation::Sigmoid>(s, x, y, n, param); break;
    case Activation::Tanh: enqueueActivationForward<Activation::Tanh>(s, x, y, n, param); break;
    case Activation::LeakyReLU: enqueueActivationForward<Activation::LeakyReLU>(s, x, y, n, param); break;
    case Activation::ELU: enqueueActivationForward<Activation::ELU>(s, x, y, n, param); break;
    case Activation::Swish: enqueueActivationForward<Activation::Swish>(s, x, y, n, param); break;
    case Activation::Mish: enqueueActivationForward<Activation::Mish>(s, x, y, n, param); break;
  }
}

void launchActivationBackward(cudaStream_t s, Activation f, const float* x, const float* g, float* dx, int64_t n,
                              float param) {
  switch (f) {
    case Activation::ReLU: enqueueActivationBackward<Activation::ReLU>(s, x, g, dx, n, param); break;
    case Activation::GELU: enqueueActivationBackward<Activation::GELU>(s, x, g, dx, n, param); break;
    case Activation::Sigmoid: enqueueActivationBackward<Activation::Sigmoid>(s, x, g, dx, n, param); break;
    case Activation::Tanh: enqueueActivationBackward<Activation::Tanh>(s, x, g, dx, n, param); break;
    case Activation::LeakyReLU: enqueueActivationBackward<Activation::LeakyReLU>(s, x, g, dx, n, param); break;
    case Activation::ELU: enqueueActivationBackward<Activation::ELU>(s, x, g, dx, n, param); break;
    case Activation::Swish: enqueueActivationBackward<Activation::Swish>(s, x, g, dx, n, param); break;
    case Activation::Mish: enqueueActivationBackward<Activation::Mish>(s, x, g, dx, n, param); break;
  }
}

void launchDropout(cudaStream_t s, const float* x, float* y, float* mask, int64_t n, float keep, float scale,
                   uint64_t seed, const uint64_t* seedOnDevice) {
  std::vector<cxemu::Access> access{reads(x, n), writes(y, n), writes(mask, n)};
  if (seedOnDevice) access.push_back(reads(seedOnDevice, 1));
  cxemu::enqueue(s, "dropoutKernel", std::move(access), [=] {
    const uint64_t drawSeed = dropoutSeed(seed, seedOnDevice);  // read when the kernel runs, as on the GPU
    for (int64_t i = 0; i < n; ++i) dropoutElement(x, y, mask, i, keep, scale, drawSeed);
  });
}

}  // namespace cyxwiz::cuda
