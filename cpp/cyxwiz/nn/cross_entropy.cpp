#include "cyxwiz/nn/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cyxwiz/common/parallel.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/softmax.h"

namespace cyxwiz::nn {

void CrossEntropyLoss::checkTarget(const Shape& outputShape, const Tensor& target, const std::string& who) const {
  checkClassTarget(outputShape, target, who, ignore_);
}

int64_t CrossEntropyLoss::terms(const Shape& outputShape, const Tensor& target) const {
  (void)outputShape;
  return countTargets(target, ignore_);
}

void CrossEntropyLoss::addLossSum(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index) const {
  const bool indices = target.dtype() == DType::Int64;
  // (N, ..., classes): every position is a row of its own.
  const int64_t classes = output.size(output.dim() - 1), rows = output.numel() / classes;
  if (output.isCuda()) {
    CYX_CUDA(crossEntropyForward(output.device().index, output.deviceData<float>(),
                                 indices ? target.deviceData<int64_t>() : nullptr,
                                 indices ? nullptr : target.deviceData<float>(), rows, classes,
                                 ignore_.value_or(cuda::kNoIgnoreIndex), 1.0, sums.deviceData<double>() + index));
    return;
  }
  const float* x = output.data<float>();
  // Each row's term on the threads, then their sum in row order (the same bits at any thread count).
  std::vector<double> rowTerms(static_cast<size_t>(rows), 0.0);
  parallelFor(rows, grainOf(classes), [&](int64_t first, int64_t last) {
    std::vector<float> exps(static_cast<size_t>(classes));
    for (int64_t r = first; r < last; ++r) {
      const float* xr = x + r * classes;
      const double logSumExp = logSumExpRow(xr, exps.data(), classes);
      double& term = rowTerms[static_cast<size_t>(r)];
      if (indices) {
        const int64_t label = target.data<int64_t>()[r];
        if (label != ignore_) term = logSumExp - xr[label];
      } else {
        const float* p = target.data<float>() + r * classes;
        for (int64_t c = 0; c < classes; ++c) term += p[c] * (logSumExp - xr[c]);
      }
    }
  });
  double total = 0.0;
  for (double term : rowTerms) total += term;
  sums.data<double>()[index] += total;
}

Tensor CrossEntropyLoss::gradient(const Tensor& output, const Tensor& target) const {
  const bool indices = target.dtype() == DType::Int64;
  // (N, ..., classes): every position is a row of its own.
  const int64_t classes = output.size(output.dim() - 1), rows = output.numel() / classes;
  if (output.isCuda()) {
    Tensor grad = Tensor::empty(output.shape(), DType::Float32, output.device());
    CYX_CUDA(crossEntropyBackward(output.device().index, output.deviceData<float>(),
                                  indices ? target.deviceData<int64_t>() : nullptr,
                                  indices ? nullptr : target.deviceData<float>(), grad.deviceData<float>(), rows,
                                  classes, ignore_.value_or(cuda::kNoIgnoreIndex)));
    return grad;
  }
  Tensor grad = Tensor::empty(output.shape());
  float* g = grad.data<float>();
  const float* x = output.data<float>();
  // The mean's count: rows not ignored (no rows counted: every gradient row is 0 anyway).
  const float invRows = 1.0f / static_cast<float>(std::max<int64_t>(countTargets(target, ignore_), 1));
  parallelFor(rows, grainOf(classes), [&](int64_t first, int64_t last) {
    softmaxRows(x + first * classes, g + first * classes, last - first, classes);
    for (int64_t r = first; r < last; ++r) {
      float* gr = g + r * classes;
      if (indices) {
        const int64_t label = target.data<int64_t>()[r];
        if (label == ignore_) {
          std::fill(gr, gr + classes, 0.0f);
          continue;
        }
        gr[label] -= 1.0f;
        for (int64_t c = 0; c < classes; ++c) gr[c] *= invRows;
      } else {
        const float* p = target.data<float>() + r * classes;
        float mass = 0.0f;
        for (int64_t c = 0; c < classes; ++c) mass += p[c];
        for (int64_t c = 0; c < classes; ++c) gr[c] = (gr[c] * mass - p[c]) * invRows;
      }
    }
  });
  return grad;
}

}  // namespace cyxwiz::nn
