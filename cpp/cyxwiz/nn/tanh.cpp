#include "cyxwiz/nn/tanh.h"

#include <cmath>

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

Tensor TanhModule::forward(const Tensor& input) {
  requireFloatTensor(input, "TanhModule.forward");
  input_ = keepForBackward(input);
  return activation(input, cuda::Activation::Tanh, [](float x) { return std::tanh(x); });
}

Tensor TanhModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  return activationGrad(input_, gradOutput, cuda::Activation::Tanh, [](float x, float g) {
    float y = std::tanh(x);
    return g * (1.0f - y * y);
  });
}

}  // namespace cyxwiz::nn
