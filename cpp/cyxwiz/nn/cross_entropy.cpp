#include "cyxwiz/nn/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/softmax.h"

namespace cyxwiz::nn {

double CrossEntropyLoss::forward(const Tensor& output, const Tensor& target) {
  bool indices = checkClassTarget(output, target, "CrossEntropyLoss.forward");
  const int64_t rows = output.size(0), classes = output.size(1);
  if (output.isCuda()) {
    const Tensor t = targetOnDevice(output, target);
    double loss = 0.0;
    CYX_CUDA(crossEntropyForward(output.device().index, output.deviceData<float>(),
                                 indices ? t.deviceData<int64_t>() : nullptr, indices ? nullptr : t.deviceData<float>(),
                                 rows, classes, &loss));
    return loss;
  }
  const float* x = output.data<float>();
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * classes;
    const float mx = *std::max_element(xr, xr + classes);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(xr[c] - mx));
    const double logSumExp = mx + std::log(sum);
    if (indices) {
      total += logSumExp - xr[target.data<int64_t>()[r]];
    } else {
      const float* p = target.data<float>() + r * classes;
      for (int64_t c = 0; c < classes; ++c) total += p[c] * (logSumExp - xr[c]);
    }
  }
  return total / static_cast<double>(rows);
}

Tensor CrossEntropyLoss::backward(const Tensor& output, const Tensor& target) {
  bool indices = checkClassTarget(output, target, "CrossEntropyLoss.backward");
  const int64_t rows = output.size(0), classes = output.size(1);
  if (output.isCuda()) {
    const Tensor t = targetOnDevice(output, target);
    Tensor grad = Tensor::empty(output.shape(), DType::Float32, output.device());
    CYX_CUDA(crossEntropyBackward(output.device().index, output.deviceData<float>(),
                                  indices ? t.deviceData<int64_t>() : nullptr, indices ? nullptr : t.deviceData<float>(),
                                  grad.deviceData<float>(), rows, classes));
    return grad;
  }
  Tensor grad = Tensor::empty(output.shape());
  float* g = grad.data<float>();
  softmaxRows(output.data<float>(), g, rows, classes);
  const float invRows = 1.0f / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    float* gr = g + r * classes;
    if (indices) {
      gr[target.data<int64_t>()[r]] -= 1.0f;
      for (int64_t c = 0; c < classes; ++c) gr[c] *= invRows;
    } else {
      const float* p = target.data<float>() + r * classes;
      float mass = 0.0f;
      for (int64_t c = 0; c < classes; ++c) mass += p[c];
      for (int64_t c = 0; c < classes; ++c) gr[c] = (gr[c] * mass - p[c]) * invRows;
    }
  }
  return grad;
}

}  // namespace cyxwiz::nn
