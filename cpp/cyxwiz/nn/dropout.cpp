#include "cyxwiz/nn/dropout.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/elementwise.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

DropoutModule::DropoutModule(double p) : p_(p) {
  CYX_CHECK(p >= 0.0 && p < 1.0, "DropoutModule(p=", p, "): p must be in [0, 1)");
}

std::string DropoutModule::repr() const { return makeString("DropoutModule(p=", p_, ")"); }

Tensor DropoutModule::forward(const Tensor& input) {
  requireFloatTensor(input, "DropoutModule.forward");
  shape_ = input.shape();
  ranForward_ = true;
  if (!training_ || p_ == 0.0) {
    mask_ = Tensor();
    return input.clone();
  }
  mask_ = Tensor::empty(input.shape());
  Tensor out = Tensor::empty(input.shape());
  const float keep = static_cast<float>(1.0 - p_);
  const float scale = 1.0f / keep;
  auto& gen = globalGenerator();
  float* m = mask_.data<float>();
  const float* x = input.data<float>();
  float* y = out.data<float>();
  const int64_t n = input.numel();
  for (int64_t i = 0; i < n; ++i) {
    m[i] = uniform01(gen) < keep ? scale : 0.0f;
    y[i] = x[i] * m[i];
  }
  return out;
}

Tensor DropoutModule::backward(const Tensor& gradOutput) {
  if (!ranForward_) throw InvalidArgument("DropoutModule.backward called before forward; run forward on the batch first");
  checkBackward(gradOutput, gradOutput, shape_);
  if (!needInputGrad_) return Tensor();
  if (!mask_.defined()) return gradOutput.clone();
  return zipElements(mask_, gradOutput, [](float m, float g) { return g * m; });
}

}  // namespace cyxwiz::nn
