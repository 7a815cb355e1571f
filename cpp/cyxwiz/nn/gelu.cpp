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
  Tensor out = Tensor::empty(input.shape());
  const float* x = input.data<float>();
  float* y = out.data<float>();
  const int64_t n = input.numel();
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
  input_ = input;
  return out;
}

Tensor GELUModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(gradOutput.shape());
  const float* x = input_.data<float>();
  const float* g = gradOutput.data<float>();
  float* dx = gradInput.data<float>();
  const int64_t n = gradOutput.numel();
  for (int64_t i = 0; i < n; ++i) {
    float cdf = 0.5f * (1.0f + std::erf(x[i] * kInvSqrt2));
    float pdf = kInvSqrt2Pi * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = g[i] * (cdf + x[i] * pdf);
  }
  return gradInput;
}

}  // namespace cyxwiz::nn
