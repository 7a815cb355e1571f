#include "cyxwiz/nn/gelu.h"

#include <cmath>

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
}  // namespace

Tensor GELUModule::forward(const Tensor& input) {
  requireFloatTensor(input, "GELUModule.forward");
  input_ = keepForBackward(input);
  return activation(input, cuda::Activation::GELU, [](float x) { return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2)); });
}

Tensor GELUModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  return activationGrad(input_, gradOutput, cuda::Activation::GELU, [](float x, float g) {
    float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
    float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    return g * (cdf + x * pdf);
  });
}

}  // namespace cyxwiz::nn
