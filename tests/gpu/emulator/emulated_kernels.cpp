// TEST DOUBLE, NOT GPU SUPPORT. The host emulator's arithmetic, following the CUDA kernels of
// cyxwiz/cuda/kernels_*.cu and blas.cu (which follow the CPU modules). See emulated_kernels.h.
#include "emulated_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace cyxwiz::cuda::emulated {

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

float sigmoid(float x) {  // branch on the sign so exp never overflows
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

float activate(Activation f, float x) {
  switch (f) {
    case Activation::ReLU: return x > 0.0f ? x : 0.0f;
    case Activation::GELU: return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
    case Activation::Sigmoid: return sigmoid(x);
    case Activation::Tanh: return std::tanh(x);
  }
  return x;
}

// g * f'(x), f' at the layer input x.
float activateGrad(Activation f, float x, float g) {
  switch (f) {
    case Activation::ReLU: return x > 0.0f ? g : 0.0f;
    case Activation::GELU: {
      const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
      return g * (cdf + x * pdf);
    }
    case Activation::Sigmoid: {
      const float y = sigmoid(x);
      return g * y * (1.0f - y);
    }
    case Activation::Tanh: {
      const float y = std::tanh(x);
      return g * (1.0f - y * y);
    }
  }
  return g;
}

// kernels_elementwise.cu's splitmix64: element i's draw depends only on (seed, i).
uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Row maximum as the kernels (fmaxf from -inf: NaNs are skipped).
float rowMax(const float* x, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) mx = std::fmax(mx, x[c]);
  return mx;
}

// kernel_utils.cuh's blockArgMax: the first maximum, NaNs never win, all NaN gives 0.
int64_t argMax(const float* row, int64_t cols) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  float best = -INFINITY;
  int64_t index = kNone;
  for (int64_t c = 0; c < cols; ++c) {
    if (row[c] > best || (row[c] == best && c < index)) {
      best = row[c];
      index = c;
    }
  }
  return index == kNone ? 0 : index;
}

}  // namespace

bool knownActivation(Activation f) {
  return f == Activation::ReLU || f == Activation::GELU || f == Activation::Sigmoid || f == Activation::Tanh;
}

void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (k <= 0) {  // C = beta C, as blas.cu's scaleMatrixKernel (beta = 0 writes zeros)
    if (beta == 1.0f) return;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float& x = c[i * ldc + j];
        x = beta == 0.0f ? 0.0f : beta * x;
      }
    }
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = transA ? a[p * lda + i] : a[i * lda + p];
        const float bv = transB ? b[j * ldb + p] : b[p * ldb + j];
        s += static_cast<double>(av) * static_cast<double>(bv);
      }
      float& x = c[i * ldc + j];
      double r = static_cast<double>(alpha) * s;
      if (beta != 0.0f) r += static_cast<double>(beta) * static_cast<double>(x);  // beta = 0: C is not read
      x = static_cast<float>(r);
    }
  }
}

void broadcastRows(const float* row, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memmove(out + r * cols, row, static_cast<size_t>(cols) * sizeof(float));
}

void addColumnSums(const float* g, float* out, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) {
    float sum = 0.0f;
    for (int64_t r = 0; r < rows; ++r) sum += g[r * cols + j];
    out[j] += sum;
  }
}

void reluInPlace(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

void activationForward(Activation f, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = activate(f, x[i]);
}

void activationBackward(Activation f, const float* x, const float* g, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = activateGrad(f, x[i], g[i]);
}

void multiply(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void dropoutForward(const float* x, float* y, float* mask, int64_t n, float keep, uint64_t seed) {
  const float scale = 1.0f / keep;
  for (int64_t i = 0; i < n; ++i) {
    // The top 24 bits, as the kernel and cyxwiz::uniform01: exactly representable floats in [0, 1).
    const float u = static_cast<float>(splitmix64(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    const float mk = u < keep ? scale : 0.0f;
    mask[i] = mk;
    y[i] = x[i] * mk;
  }
}

void softmaxForward(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float mx = rowMax(xr, cols);
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const float e = std::exp(xr[c] - mx);
      yr[c] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}

void softmaxBackward(const float* y, const float* g, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* gr = g + r * cols;
    double dot = 0.0;
    for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(gr[c]) * yr[c];
    const float d = static_cast<float>(dot);
    for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = yr[c] * (gr[c] - d);
  }
}

double crossEntropySum(const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                       int64_t classes) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = logits + r * classes;
    const float mx = rowMax(xr, classes);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(xr[c] - mx));
    const double logSumExp = mx + std::log(sum);
    if (labels) {
      total += logSumExp - xr[labels[r]];
    } else {
      const float* p = probs + r * classes;
      double t = 0.0;
      for (int64_t c = 0; c < classes; ++c) t += p[c] * (logSumExp - xr[c]);
      total += t;
    }
  }
  return total;
}

void crossEntropyBackward(const float* logits, const int64_t* labels, const float* probs, float* grad, int64_t rows,
                          int64_t classes) {
  const float invRows = 1.0f / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = logits + r * classes;
    float* gr = grad + r * classes;
    const float mx = rowMax(xr, classes);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) {
      const float e = std::exp(xr[c] - mx);
      gr[c] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    if (labels) {  // (softmax - onehot) / rows
      const int64_t label = labels[r];
      for (int64_t c = 0; c < classes; ++c) {
        float v = gr[c] * inv;
        if (c == label) v -= 1.0f;
        gr[c] = v * invRows;
      }
    } else {  // (softmax * mass - p) / rows
      const float* p = probs + r * classes;
      double mass = 0.0;
      for (int64_t c = 0; c < classes; ++c) mass += p[c];
      const float massF = static_cast<float>(mass);
      for (int64_t c = 0; c < classes; ++c) gr[c] = (gr[c] * inv * massF - p[c]) * invRows;
    }
  }
}

double squaredErrorSum(const float* y, const float* t, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(y[i]) - t[i];
    total += d * d;
  }
  return total;
}

void mseBackward(const float* y, const float* t, float* grad, int64_t n) {
  const float scale = 2.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) grad[i] = scale * (y[i] - t[i]);
}

int64_t countCorrect(const float* logits, const int64_t* labels, const float* probs, int64_t rows, int64_t classes) {
  int64_t total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t predicted = argMax(logits + r * classes, classes);
    const int64_t truth = labels ? labels[r] : argMax(probs + r * classes, classes);
    total += predicted == truth;
  }
  return total;
}

void sgdStep(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weightDecay,
             bool nesterov) {
  if (!buf) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weightDecay * p[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + weightDecay * p[i];
    const float bi = momentum * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr * (nesterov ? gi + momentum * bi : bi);
  }
}

void adamStep(float* p, const float* g, float* m, float* v, int64_t n, float stepSize, float b1, float b2, float eps,
              float invSqrtBc2, float l2, float decay) {
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[i];
    const float gi = g[i] + l2 * pi;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi * decay - stepSize * mi / (std::sqrt(vi) * invSqrtBc2 + eps);
  }
}

}  // namespace cyxwiz::cuda::emulated
