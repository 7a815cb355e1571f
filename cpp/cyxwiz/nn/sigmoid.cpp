#include "cyxwiz/nn/sigmoid.h"

#include <cmath>

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

Tensor SigmoidModule::forward(const Tensor& input) {
  requireFloatTensor(input, "SigmoidModule.forward");
  Tensor out = Tensor::empty(input.shape());
  const float* x = input.data<float>();
  float* y = out.data<float>();
  const int64_t n = input.numel();
  for (int64_t i = 0; i < n; ++i) {
    // Branch on the sign so exp never overflows.
    if (x[i] >= 0.0f) {
      y[i] = 1.0f / (1.0f + std::exp(-x[i]));
    } else {
      float e = std::exp(x[i]);
      y[i] = e / (1.0f + e);
    }
  }
  output_ = out;
  return out;
}

Tensor SigmoidModule::backward(const Tensor& gradOutput) {
  checkBackward(output_, gradOutput, output_.shape());
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(gradOutput.shape());
  const float* y = output_.data<float>();
  const float* g = gradOutput.data<float>();
  float* dx = gradInput.data<float>();
  const int64_t n = gradOutput.numel();
  for (int64_t i = 0; i < n; ++i) dx[i] = g[i] * y[i] * (1.0f - y[i]);
  return gradInput;
}

}  // namespace cyxwiz::nn
