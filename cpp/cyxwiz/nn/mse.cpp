#include "cyxwiz/nn/mse.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::nn {

void MSELoss::checkTarget(const Shape& outputShape, const Tensor& target, const std::string& who) const {
  CYX_CHECK(target.dtype() == DType::Float32, who, ": output and target must be float32, got float32 and ",
            dtypeName(target.dtype()));
  CYX_CHECK(outputShape == target.shape(), who, ": output ", shapeString(outputShape), " and target ",
            shapeString(target.shape()), " must have the same shape");
  CYX_CHECK(shapeNumel(outputShape) > 0, who, ": the batch is empty");
}

void MSELoss::addLossSum(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index) const {
  // rows * mean = (sum of squares) * rows / numel.
  const int64_t n = output.numel();
  const double scale = static_cast<double>(output.size(0)) / static_cast<double>(n);
  if (output.isCuda()) {
    CYX_CUDA(mseForward(output.device().index, output.deviceData<float>(), target.deviceData<float>(), n, scale,
                        sums.deviceData<double>() + index));
    return;
  }
  const float* y = output.data<float>();
  const float* t = target.data<float>();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(y[i]) - t[i];
    total += d * d;
  }
  sums.data<double>()[index] += total * scale;
}

Tensor MSELoss::gradient(const Tensor& output, const Tensor& target) const {
  const int64_t n = output.numel();
  if (output.isCuda()) {
    Tensor grad = Tensor::empty(output.shape(), DType::Float32, output.device());
    CYX_CUDA(mseBackward(output.device().index, output.deviceData<float>(), target.deviceData<float>(),
                         grad.deviceData<float>(), n));
    return grad;
  }
  Tensor grad = Tensor::empty(output.shape());
  const float* y = output.data<float>();
  const float* t = target.data<float>();
  float* g = grad.data<float>();
  const float scale = 2.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) g[i] = scale * (y[i] - t[i]);
  return grad;
}

}  // namespace cyxwiz::nn
