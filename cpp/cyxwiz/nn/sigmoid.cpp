#include "cyxwiz/nn/sigmoid.h"

#include <cmath>

#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

namespace {

// Branch on the sign so exp never overflows.
inline float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  float e = std::exp(x);
  return e / (1.0f + e);
}

}  // namespace

Tensor SigmoidModule::forward(const Tensor& input) {
  requireFloatTensor(input, "SigmoidModule.forward");
  input_ = keepForBackward(input);
  return activation(input, cuda::Activation::Sigmoid, sigmoid);
}

Tensor SigmoidModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  return activationGrad(input_, gradOutput, cuda::Activation::Sigmoid, [](float x, float g) {
    float y = sigmoid(x);
    return g * y * (1.0f - y);
  });
}

}  // namespace cyxwiz::nn
