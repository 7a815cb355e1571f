#include "cyxwiz/nn/relu.h"

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

Tensor ReLUModule::forward(const Tensor& input) {
  requireFloatTensor(input, "ReLUModule.forward");
  input_ = keepForBackward(input);
  return activation(input, cuda::Activation::ReLU, [](float x) { return x > 0.0f ? x : 0.0f; });
}

Tensor ReLUModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  return activationGrad(input_, gradOutput, cuda::Activation::ReLU, [](float x, float g) { return x > 0.0f ? g : 0.0f; });
}

}  // namespace cyxwiz::nn
