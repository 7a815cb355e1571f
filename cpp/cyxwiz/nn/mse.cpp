#include "cyxwiz/nn/mse.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::nn {

namespace {

void checkSameShape(const Tensor& output, const Tensor& target, const char* who) {
  CYX_CHECK(output.dtype() == DType::Float32 && target.dtype() == DType::Float32, who, ": output and target must be float32, got ",
            dtypeName(output.dtype()), " and ", dtypeName(target.dtype()));
  CYX_CHECK(output.shape() == target.shape(), who, ": output ", shapeString(output.shape()), " and target ",
            shapeString(target.shape()), " must have the same shape");
  CYX_CHECK(output.numel() > 0, who, ": the batch is empty");
}

}  // namespace

double MSELoss::forward(const Tensor& output, const Tensor& target) {
  checkSameShape(output, target, "MSELoss.forward");
  if (output.isCuda()) {
    const Tensor t = targetOnDevice(output, target);
    double loss = 0.0;
    CYX_CUDA(mseForward(output.device().index, output.deviceData<float>(), t.deviceData<float>(), output.numel(), &loss));
    return loss;
  }
  const float* y = output.data<float>();
  const float* t = target.data<float>();
  const int64_t n = output.numel();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(y[i]) - t[i];
    total += d * d;
  }
  return total / static_cast<double>(n);
}

Tensor MSELoss::backward(const Tensor& output, const Tensor& target) {
  checkSameShape(output, target, "MSELoss.backward");
  if (output.isCuda()) {
    const Tensor t = targetOnDevice(output, target);
    Tensor grad = Tensor::empty(output.shape(), DType::Float32, output.device());
    CYX_CUDA(mseBackward(output.device().index, output.deviceData<float>(), t.deviceData<float>(), grad.deviceData<float>(),
                         output.numel()));
    return grad;
  }
  Tensor grad = Tensor::empty(output.shape());
  const float* y = output.data<float>();
  const float* t = target.data<float>();
  float* g = grad.data<float>();
  const int64_t n = output.numel();
  const float scale = 2.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) g[i] = scale * (y[i] - t[i]);
  return grad;
}

}  // namespace cyxwiz::nn
