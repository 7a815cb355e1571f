// Row-wise softmax, the losses and the correct-prediction count (nn/softmax.cpp, cross_entropy.cpp,
// mse.cpp, loss.cpp). One block per row; sums in double as the CPU. The scalar results are
// deterministic: per-block partials in a fixed order, then one block sums them in a fixed order.
// The per-element math is kernel_math.h's; the ApiImpl methods are in ops_loss.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

// The row's maximum by the whole block (fmaxf from -inf: NaNs are skipped).
__device__ float rowMax(const float* xr, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, xr[c]);
  return blockMax(mx);
}

// One row, by the whole block: out[c] = exp(x[c] - max), returning 1 / sum(out) to every thread. Each
// thread writes the columns it later reads, so callers may scale out[c] without another barrier.
__device__ float softmaxNumerators(const float* xr, float* out, int64_t cols) {
  const float mx = rowMax(xr, cols);
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float e = softmaxNumerator(xr[c], mx);
    out[c] = e;
    sum += e;
  }
  return inverseSum(blockSum(sum));
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
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += softmaxDotTerm(gr[c], yr[c]);
    const float d = static_cast<float>(blockSum(dot));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dx[r * cols + c] = softmaxBackwardElement(yr[c], gr[c], d);
  }
}

// Per row: logSumExp - x[label], or sum_c p_c (logSumExp - x_c); each block accumulates its rows
// in order into partial[blockIdx.x]. A row whose label is `ignore` adds nothing (the whole block skips it).
__global__ void crossEntropyForwardKernel(const float* x, const int64_t* labels, const float* probs, int64_t rows,
                                          int64_t cols, int64_t ignore, double* partial) {
  double acc = 0.0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (labels && labels[r] == ignore) continue;
    const float* xr = x + r * cols;
    const float mx = rowMax(xr, cols);
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += logSumExpTerm(xr[c], mx);
    const double lse = logSumExp(mx, blockSum(sum));
    double rowLoss;
    if (labels) {
      rowLoss = labelRowLoss(lse, xr, labels[r]);
    } else {
      const float* p = probs + r * cols;
      double t = 0.0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) t += probsLossTerm(p[c], lse, xr[c]);
      rowLoss = blockSum(t);
    }
    acc += rowLoss;
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// d(mean loss)/d(logits): (softmax - onehot) / count, or (softmax * mass - p) / rows; 0 on ignored rows.
__global__ void crossEntropyBackwardKernel(const float* x, const int64_t* labels, const float* probs, float* grad,
                                           int64_t rows, int64_t cols, int64_t ignore, float invRows,
                                           const long long* count) {
  if (count) invRows = 1.0f / static_cast<float>(*count > 0 ? *count : 1);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* gr = grad + r * cols;
    if (labels && labels[r] == ignore) {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) gr[c] = 0.0f;
      continue;
    }
    const float inv = softmaxNumerators(x + r * cols, gr, cols);
    if (labels) {
      const int64_t label = labels[r];
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        gr[c] = crossEntropyLabelGrad(gr[c], inv, c == label, invRows);
      }
    } else {
      const float* p = probs + r * cols;
      double m = 0.0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m += p[c];
      const float mass = static_cast<float>(blockSum(m));
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        gr[c] = crossEntropyProbsGrad(gr[c], inv, mass, p[c], invRows);
      }
    }
  }
}

__global__ void squaredErrorKernel(const float* y, const float* t, int64_t n, double* partial) {
  double acc = 0.0;
  for (int64_t i = globalIndex(); i < n; i += globalStride()) acc += squaredErrorTerm(y, t, i);
  acc = blockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void mseBackwardKernel(const float* y, const float* t, float* grad, int64_t n, float scale) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) mseBackwardElement(y, t, grad, i, scale);
}

__global__ void countCorrectKernel(const float* x, const int64_t* labels, const float* probs, int64_t rows,
                                   int64_t cols, int64_t ignore, long long* partial) {
  long long acc = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (labels && labels[r] == ignore) continue;
    const int64_t predicted = blockArgMax(x + r * cols, cols);
    const int64_t truth = labels ? labels[r] : blockArgMax(probs + r * cols, cols);
    acc += predicted == truth;
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: *count = the labels that are not `ignore`.
__global__ void countLabelsKernel(const int64_t* labels, int64_t rows, int64_t ignore, long long* count) {
  long long acc = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += labels[r] != ignore;
  acc = blockSum(acc);
  if (threadIdx.x == 0) *count = acc;
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

}  // namespace

void launchSoftmaxForward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols) {
  softmaxForwardKernel<<<gridFor(rows, 1), rowThreads(cols), 0, s>>>(x, y, rows, cols);
}

void launchSoftmaxBackward(cudaStream_t s, const float* y, const float* g, float* dx, int64_t rows, int64_t cols) {
  softmaxBackwardKernel<<<gridFor(rows, 1), rowThreads(cols), 0, s>>>(y, g, dx, rows, cols);
}

int launchCrossEntropyPartials(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                               int64_t rows, int64_t classes, int64_t ignore, double* partial, int capacity) {
  const int blocks = rowPartials(rows, capacity);
  crossEntropyForwardKernel<<<static_cast<unsigned>(blocks), rowThreads(classes), 0, s>>>(logits, labels, probs, rows,
                                                                                          classes, ignore, partial);
  return blocks;
}

int launchSquaredErrorPartials(cudaStream_t s, const float* y, const float* t, int64_t n, double* partial,
                               int capacity) {
  const int blocks = elementPartials(n, capacity);
  squaredErrorKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(y, t, n, partial);
  return blocks;
}

int launchCountCorrectPartials(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                               int64_t rows, int64_t classes, int64_t ignore, long long* partial, int capacity) {
  const int blocks = rowPartials(rows, capacity);
  countCorrectKernel<<<static_cast<unsigned>(blocks), rowThreads(classes), 0, s>>>(logits, labels, probs, rows,
                                                                                   classes, ignore, partial);
  return blocks;
}

void launchCountLabels(cudaStream_t s, const int64_t* labels, int64_t rows, int64_t ignore, long long* count) {
  countLabelsKernel<<<1, kThreads, 0, s>>>(labels, rows, ignore, count);
}

void launchFinishSum(cudaStream_t s, const double* partial, int count, double scale, double* sum) {
  finishSumKernel<<<1, kThreads, 0, s>>>(partial, count, scale, sum);
}

void launchFinishCount(cudaStream_t s, const long long* partial, int count, double* sum) {
  finishCountKernel<<<1, kThreads, 0, s>>>(partial, count, sum);
}

void launchCrossEntropyBackward(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                                float* grad, int64_t rows, int64_t classes, int64_t ignore, float invRows,
                                const long long* count) {
  crossEntropyBackwardKernel<<<gridFor(rows, 1), rowThreads(classes), 0, s>>>(logits, labels, probs, grad, rows,
                                                                             classes, ignore, invRows, count);
}

void launchMseBackward(cudaStream_t s, const float* y, const float* t, float* grad, int64_t n, float scale) {
  mseBackwardKernel<<<gridFor(n), kThreads, 0, s>>>(y, t, grad, n, scale);
}

}  // namespace cyxwiz::cuda
