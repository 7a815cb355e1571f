// Row-wise softmax, the losses and the correct-prediction count (nn/softmax.cpp, cross_entropy.cpp,
// mse.cpp, loss.cpp). One block per row; sums in double as the CPU. The scalar results are
// deterministic: per-block partials in a fixed order, then one block sums them in a fixed order.
#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

// Blocks for a reduction over `rows` rows: one per row up to kMaxPartials, each then loops.
unsigned partialBlocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, kMaxPartials)); }

// One row, by the whole block: out[c] = exp(x[c] - max), returning 1 / sum(out) to every thread. Each
// thread writes the columns it later reads, so callers may scale out[c] without another barrier.
__device__ float softmaxNumerators(const float* xr, float* out, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, xr[c]);
  mx = blockMax(mx);
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float e = expf(xr[c] - mx);
    out[c] = e;
    sum += e;
  }
  return static_cast<float>(1.0 / blockSum(sum));
}

__global__ void softmaxForwardKernel(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* yr = y + r * cols;
    const float inv = softmaxNumerators(x + r * cols, yr, cols);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] *= inv;
  }
}

__global__ void softmaxBackwardKernel(const float* y, const float* g, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* yr = y + r * cols;
    const float* gr = g + r * cols;
    double dot = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += static_cast<double>(gr[c]) * yr[c];
    const float d = static_cast<float>(blockSum(dot));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dx[r * cols + c] = yr[c] * (gr[c] - d);
  }
}

// Per row: logSumExp - x[label], or sum_c p_c (logSumExp - x_c); each block accumulates its rows
// in order into partial[blockIdx.x].
__global__ void crossEntropyForwardKernel(const float* x, const int64_t* labels, const float* probs, int64_t rows,
                                          int64_t cols, double* partial) {
  double acc = 0.0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, xr[c]);
    mx = blockMax(mx);
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += exp(static_cast<double>(xr[c] - mx));
    const double logSumExp = mx + log(blockSum(sum));
    double rowLoss;
    if (labels) {
      rowLoss = logSumExp - xr[labels[r]];
    } else {
      const float* p = probs + r * cols;
      double t = 0.0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) t += p[c] * (logSumExp - xr[c]);
      rowLoss = blockSum(t);
    }
    acc += rowLoss;
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// d(mean loss)/d(logits): (softmax - onehot) / rows, or (softmax * mass - p) / rows.
__global__ void crossEntropyBackwardKernel(const float* x, const int64_t* labels, const float* probs, float* grad,
                                           int64_t rows, int64_t cols, float invRows) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* gr = grad + r * cols;
    const float inv = softmaxNumerators(x + r * cols, gr, cols);
    if (labels) {
      const int64_t label = labels[r];
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = gr[c] * inv;
        if (c == label) v -= 1.0f;
        gr[c] = v * invRows;
      }
    } else {
      const float* p = probs + r * cols;
      double m = 0.0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m += p[c];
      const float mass = static_cast<float>(blockSum(m));
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) gr[c] = (gr[c] * inv * mass - p[c]) * invRows;
    }
  }
}

__global__ void squaredErrorKernel(const float* y, const float* t, int64_t n, double* partial) {
  double acc = 0.0;
  for (int64_t i = globalIndex(); i < n; i += globalStride()) {
    const double d = static_cast<double>(y[i]) - t[i];
    acc += d * d;
  }
  acc = blockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void mseBackwardKernel(const float* y, const float* t, float* grad, int64_t n, float scale) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) grad[i] = scale * (y[i] - t[i]);
}

__global__ void countCorrectKernel(const float* x, const int64_t* labels, const float* probs, int64_t rows,
                                   int64_t cols, long long* partial) {
  long long acc = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t predicted = blockArgMax(x + r * cols, cols);
    const int64_t truth = labels ? labels[r] : blockArgMax(probs + r * cols, cols);
    acc += predicted == truth;
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: *sum += scale * (sum of partial[0..count)). Fixed order for a given count.
__global__ void finishSumKernel(const double* partial, int count, double scale, double* sum) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = blockSum(acc);
  if (threadIdx.x == 0) *sum += acc * scale;
}

__global__ void finishCountKernel(const long long* partial, int count, double* sum) {
  long long acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = blockSum(acc);
  if (threadIdx.x == 0) *sum += static_cast<double>(acc);
}

Status targetMissing(const char* who, int dev) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": neither labels nor probs was given";
}

}  // namespace

Status ApiImpl::softmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  softmaxForwardKernel<<<gridFor(rows, 1), rowThreads(cols), 0, s->compute>>>(x, y, rows, cols);
  return launchStatus("softmaxForwardKernel", dev);
}

Status ApiImpl::softmaxBackward(int dev, const float* y, const float* g, float* dx, int64_t rows,
                                int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  softmaxBackwardKernel<<<gridFor(rows, 1), rowThreads(cols), 0, s->compute>>>(y, g, dx, rows, cols);
  return launchStatus("softmaxBackwardKernel", dev);
}

Status ApiImpl::crossEntropyForward(int dev, const float* logits, const int64_t* labels, const float* probs,
                                    int64_t rows, int64_t classes, double scale, double* sum) noexcept {
  if (!labels && !probs) return targetMissing("crossEntropyForward", dev);
  if (rows <= 0 || classes <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  // The partials are shared by every reduction of this device. They run in order on the compute
  // stream; the lock keeps another thread's reduction from being enqueued between our two kernels.
  std::lock_guard<std::mutex> lock(s->mutex);
  const unsigned blocks = partialBlocks(rows);
  crossEntropyForwardKernel<<<blocks, rowThreads(classes), 0, s->compute>>>(logits, labels, probs, rows, classes,
                                                                           s->scratch->partial);
  CX_TRY(launchStatus("crossEntropyForwardKernel", dev));
  finishSumKernel<<<1, kThreads, 0, s->compute>>>(s->scratch->partial, static_cast<int>(blocks), scale, sum);
  return launchStatus("finishSumKernel", dev);
}

Status ApiImpl::crossEntropyBackward(int dev, const float* logits, const int64_t* labels, const float* probs,
                                     float* grad, int64_t rows, int64_t classes) noexcept {
  if (!labels && !probs) return targetMissing("crossEntropyBackward", dev);
  if (rows <= 0 || classes <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const float invRows = 1.0f / static_cast<float>(rows);
  crossEntropyBackwardKernel<<<gridFor(rows, 1), rowThreads(classes), 0, s->compute>>>(logits, labels, probs, grad,
                                                                                      rows, classes, invRows);
  return launchStatus("crossEntropyBackwardKernel", dev);
}

Status ApiImpl::mseForward(int dev, const float* y, const float* t, int64_t n, double scale, double* sum) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  std::lock_guard<std::mutex> lock(s->mutex);
  const unsigned blocks = std::min<unsigned>(gridFor(n), kMaxPartials);
  squaredErrorKernel<<<blocks, kThreads, 0, s->compute>>>(y, t, n, s->scratch->partial);
  CX_TRY(launchStatus("squaredErrorKernel", dev));
  finishSumKernel<<<1, kThreads, 0, s->compute>>>(s->scratch->partial, static_cast<int>(blocks), scale, sum);
  return launchStatus("finishSumKernel", dev);
}

Status ApiImpl::mseBackward(int dev, const float* y, const float* t, float* grad, int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  mseBackwardKernel<<<gridFor(n), kThreads, 0, s->compute>>>(y, t, grad, n, 2.0f / static_cast<float>(n));
  return launchStatus("mseBackwardKernel", dev);
}

Status ApiImpl::countCorrect(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                             int64_t classes, double* sum) noexcept {
  if (!labels && !probs) return targetMissing("countCorrect", dev);
  if (rows <= 0 || classes <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  std::lock_guard<std::mutex> lock(s->mutex);
  const unsigned blocks = partialBlocks(rows);
  countCorrectKernel<<<blocks, rowThreads(classes), 0, s->compute>>>(logits, labels, probs, rows, classes,
                                                                    s->scratch->count);
  CX_TRY(launchStatus("countCorrectKernel", dev));
  finishCountKernel<<<1, kThreads, 0, s->compute>>>(s->scratch->count, static_cast<int>(blocks), sum);
  return launchStatus("finishCountKernel", dev);
}

}  // namespace cyxwiz::cuda
