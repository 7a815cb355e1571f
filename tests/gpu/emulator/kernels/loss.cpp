// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_loss.cu on the host: the
// same kernel_math.h functions, queued on the stream through cxemu::enqueue, with the block
// reductions replayed in the GPU's order (block.h). A row of `cols` runs as a block of
// rowThreads(cols) threads, the partials' blocks as the launches size them (launch.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "kernels/block.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::blockStridedSum;
using emulated::reads;
using emulated::writes;

namespace {

// fmaxf from -inf, as kernel_utils.cuh's blockMax: NaNs are skipped, and the order does not matter.
float rowMax(const float* xr, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) mx = fmaxf(mx, xr[c]);
  return mx;
}

// kernels_loss.cu's softmaxNumerators: out[c] = exp(x[c] - max), returning 1 / sum(out).
float softmaxNumerators(const float* xr, float* out, int64_t cols) {
  const float mx = rowMax(xr, cols);
  return inverseSum(blockStridedSum<double>(rowThreads(cols), cols, [&](int64_t c) {
    const float e = softmaxNumerator(xr[c], mx);
    out[c] = e;
    return static_cast<double>(e);
  }));
}

int64_t rowArgMax(const float* row, int64_t cols) {
  ArgMax best = noArgMax();
  for (int64_t c = 0; c < cols; ++c) best = better(best, ArgMax{row[c], c});
  return argMaxIndex(best);
}

// The logits and the target of rows x classes that the kernels read: the labels (int64 per row)
// when given, else probs (a row each).
std::vector<cxemu::Access> classInputs(const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                                       int64_t classes) {
  std::vector<cxemu::Access> access{reads(logits, rows * classes)};
  access.push_back(labels ? reads(labels, rows) : reads(probs, rows * classes));
  return access;
}

// One row's cross-entropy, as the kernel's block. A label outside [0, classes) (api.h: the engine
// range-checks them) would make the GPU read outside the row: reported, and the row's loss is NaN.
double crossEntropyRow(const float* xr, const int64_t* labels, const float* probs, int64_t r, int64_t cols) {
  const int threads = rowThreads(cols);
  const float mx = rowMax(xr, cols);
  const double lse = logSumExp(mx, blockStridedSum<double>(threads, cols, [&](int64_t c) {
                                 return logSumExpTerm(xr[c], mx);
                               }));
  if (labels) {
    if (labels[r] < 0 || labels[r] >= cols) {
      std::fprintf(stderr, "emulator: crossEntropyForwardKernel: labels[%lld] = %lld is outside [0, %lld)\n",
                   static_cast<long long>(r), static_cast<long long>(labels[r]), static_cast<long long>(cols));
      return NAN;
    }
    return labelRowLoss(lse, xr, labels[r]);
  }
  const float* p = probs + r * cols;
  return blockStridedSum<double>(threads, cols, [&](int64_t c) { return probsLossTerm(p[c], lse, xr[c]); });
}

}  // namespace

void launchSoftmaxForward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols) {
  cxemu::enqueue(s, "softmaxForwardKernel", {reads(x, rows * cols), writes(y, rows * cols)}, [=] {
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * cols;
      const float inv = softmaxNumerators(x + r * cols, yr, cols);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
  });
}

void launchSoftmaxBackward(cudaStream_t s, const float* y, const float* g, float* dx, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  cxemu::enqueue(s, "softmaxBackwardKernel", {reads(y, n), reads(g, n), writes(dx, n)}, [=] {
    for (int64_t r = 0; r < rows; ++r) {
      const float* yr = y + r * cols;
      const float* gr = g + r * cols;
      const float d = static_cast<float>(
          blockStridedSum<double>(rowThreads(cols), cols, [&](int64_t c) { return softmaxDotTerm(gr[c], yr[c]); }));
      for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = softmaxBackwardElement(yr[c], gr[c], d);
    }
  });
}

// Block b takes the rows b, b + blocks, ... in order, into partial[b].
int launchCrossEntropyPartials(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                               int64_t rows, int64_t classes, int64_t ignore, double* partial, int capacity) {
  const int blocks = rowPartials(rows, capacity);
  std::vector<cxemu::Access> access = classInputs(logits, labels, probs, rows, classes);
  access.push_back(writes(partial, blocks));
  cxemu::enqueue(s, "crossEntropyForwardKernel", std::move(access), [=] {
    for (int b = 0; b < blocks; ++b) {
      double acc = 0.0;
      for (int64_t r = b; r < rows; r += blocks) {
        if (labels && labels[r] == ignore) continue;
        acc += crossEntropyRow(logits + r * classes, labels, probs, r, classes);
      }
      partial[b] = acc;
    }
  });
  return blocks;
}

// Block b's threads take the elements b * kThreads + t, then a grid's stride further, in order.
int launchSquaredErrorPartials(cudaStream_t s, const float* y, const float* t, int64_t n, double* partial,
                               int capacity) {
  const int blocks = elementPartials(n, capacity);
  cxemu::enqueue(s, "squaredErrorKernel", {reads(y, n), reads(t, n), writes(partial, blocks)}, [=] {
    const int64_t stride = static_cast<int64_t>(blocks) * kThreads;
    for (int b = 0; b < blocks; ++b) {
      emulated::PerThread<double> acc{};
      for (int k = 0; k < kThreads; ++k) {
        const int64_t first = static_cast<int64_t>(b) * kThreads + k;
        for (int64_t i = first; i < n; i += stride) acc[k] += squaredErrorTerm(y, t, i);
      }
      partial[b] = emulated::blockSum(acc, kThreads);
    }
  });
  return blocks;
}

int launchCountCorrectPartials(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                               int64_t rows, int64_t classes, int64_t ignore, long long* partial, int capacity) {
  const int blocks = rowPartials(rows, capacity);
  std::vector<cxemu::Access> access = classInputs(logits, labels, probs, rows, classes);
  access.push_back(writes(partial, blocks));
  cxemu::enqueue(s, "countCorrectKernel", std::move(access), [=] {
    for (int b = 0; b < blocks; ++b) {
      long long acc = 0;
      for (int64_t r = b; r < rows; r += blocks) {
        if (labels && labels[r] == ignore) continue;
        const int64_t predicted = rowArgMax(logits + r * classes, classes);
        const int64_t truth = labels ? labels[r] : rowArgMax(probs + r * classes, classes);
        acc += predicted == truth;
      }
      partial[b] = acc;
    }
  });
  return blocks;
}

void launchCountLabels(cudaStream_t s, const int64_t* labels, int64_t rows, int64_t ignore, long long* count) {
  cxemu::enqueue(s, "countLabelsKernel", {reads(labels, rows), writes(count, 1)}, [=] {
    *count = blockStridedSum<long long>(kThreads, rows, [&](int64_t r) { return labels[r] != ignore ? 1LL : 0LL; });
  });
}

void launchFinishSum(cudaStream_t s, const double* partial, int count, double scale, double* sum) {
  cxemu::enqueue(s, "finishSumKernel", {reads(partial, count), writes(sum, 1)}, [=] {
    *sum += blockStridedSum<double>(kThreads, count, [&](int64_t i) { return partial[i]; }) * scale;
  });
}

void launchFinishCount(cudaStream_t s, const long long* partial, int count, double* sum) {
  cxemu::enqueue(s, "finishCountKernel", {reads(partial, count), writes(sum, 1)}, [=] {
    *sum += static_cast<double>(blockStridedSum<long long>(kThreads, count, [&](int64_t i) { return partial[i]; }));
  });
}

void launchCrossEntropyBackward(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                                float* grad, int64_t rows, int64_t classes, int64_t ignore, float invRows,
                                const long long* count) {
  std::vector<cxemu::Access> access = classInputs(logits, labels, probs, rows, classes);
  access.push_back(writes(grad, rows * classes));
  if (count) access.push_back(reads(count, 1));
  cxemu::enqueue(s, "crossEntropyBackwardKernel", std::move(access), [=] {
    const float scale = count ? 1.0f / static_cast<float>(*count > 0 ? *count : 1) : invRows;
    for (int64_t r = 0; r < rows; ++r) {
      float* gr = grad + r * classes;
      if (labels && labels[r] == ignore) {
        std::fill(gr, gr + classes, 0.0f);
        continue;
      }
      const float inv = softmaxNumerators(logits + r * classes, gr, classes);
      if (labels) {
        const int64_t label = labels[r];
        for (int64_t c = 0; c < classes; ++c) gr[c] = crossEntropyLabelGrad(gr[c], inv, c == label, scale);
      } else {
        const float* p = probs + r * classes;
        const float mass = static_cast<float>(blockStridedSum<double>(
            rowThreads(classes), classes, [&](int64_t c) { return static_cast<double>(p[c]); }));
        for (int64_t c = 0; c < classes; ++c) gr[c] = crossEntropyProbsGrad(gr[c], inv, mass, p[c], scale);
      }
    }
  });
}

void launchMseBackward(cudaStream_t s, const float* y, const float* t, float* grad, int64_t n, float scale) {
  cxemu::enqueue(s, "mseBackwardKernel", {reads(y, n), reads(t, n), writes(grad, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) mseBackwardElement(y, t, grad, i, scale);
  });
}

}  // namespace cyxwiz::cuda
