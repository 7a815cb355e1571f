#include "cyxwiz/nn/relu.h"

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

Tensor ReLUModule::forward(const Tensor& input) {
  requireFloatTensor(input, "ReLUModule.forward");
  Tensor out = Tensor::empty(input.shape());
  const float* x = input.data<float>();
  float* y = out.data<float>();
  const int64_t n = input.numel();
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  output_ = out;
  return out;
}

Tensor ReLUModule::backward(const Tensor& gradOutput) {
  checkBackward(output_, gradOutput, output_.shape());
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(gradOutput.shape());
  const float* y = output_.data<float>();
  const float* g = gradOutput.data<float>();
  float* dx = gradInput.data<float>();
  const int64_t n = gradOutput.numel();
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? g[i] : 0.0f;
  return gradInput;
}

}  // namespace cyxwiz::nn
