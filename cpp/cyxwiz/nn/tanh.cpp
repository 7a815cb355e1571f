#include "cyxwiz/nn/tanh.h"

#include <cmath>

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

Tensor TanhModule::forward(const Tensor& input) {
  requireFloatTensor(input, "TanhModule.forward");
  Tensor out = Tensor::empty(input.shape());
  const float* x = input.data<float>();
  float* y = out.data<float>();
  const int64_t n = input.numel();
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
  output_ = out;
  return out;
}

Tensor TanhModule::backward(const Tensor& gradOutput) {
  checkBackward(output_, gradOutput, output_.shape());
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(gradOutput.shape());
  const float* y = output_.data<float>();
  const float* g = gradOutput.data<float>();
  float* dx = gradInput.data<float>();
  const int64_t n = gradOutput.numel();
  for (int64_t i = 0; i < n; ++i) dx[i] = g[i] * (1.0f - y[i] * y[i]);
  return gradInput;
}

}  // namespace cyxwiz::nn
