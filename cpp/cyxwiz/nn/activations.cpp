#include "cyxwiz/nn/activations.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// log(1 + e^x) without overflow, with torch's threshold of 20 above which it is x.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

Tensor PointwiseModule::forward(const Tensor& input) {
  requireFloatTensor(input, typeName() + ".forward");
  input_ = keepForBackward(input);
  if (input.isCuda()) {
    Tensor y = Tensor::empty(input.shape(), DType::Float32, input.device());
    ops::gpuActivation(input, y, gpuKind(), gpuParam());
    return y;
  }
  return mapElements(input, [this](float x) { return value(x); });
}

Tensor PointwiseModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  const Tensor g = gradOutput.to(input_.device());
  if (g.isCuda()) {
    Tensor dx = Tensor::empty(g.shape(), DType::Float32, g.device());
    ops::gpuActivationGrad(input_, g, dx, gpuKind(), gpuParam());
    return dx;
  }
  return zipElements(input_, g, [this](float x, float d) { return d * derivative(x); });
}

LeakyReLUModule::LeakyReLUModule(double negativeSlope) : slope_(negativeSlope) {
  CYX_CHECK(std::isfinite(negativeSlope), "LeakyReLUModule(negative_slope=", negativeSlope, "): must be finite");
}

std::string LeakyReLUModule::repr() const { return makeString("LeakyReLUModule(negative_slope=", slope_, ")"); }

ELUModule::ELUModule(double alpha) : alpha_(alpha) {
  CYX_CHECK(std::isfinite(alpha), "ELUModule(alpha=", alpha, "): must be finite");
}

std::string ELUModule::repr() const { return makeString("ELUModule(alpha=", alpha_, ")"); }

float ELUModule::value(float x) const { return x > 0.0f ? x : static_cast<float>(alpha_) * std::expm1(x); }

float ELUModule::derivative(float x) const { return x > 0.0f ? 1.0f : static_cast<float>(alpha_) * std::exp(x); }

float SwishModule::value(float x) const { return x * sigmoid(x); }

float SwishModule::derivative(float x) const {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

float MishModule::value(float x) const { return x * std::tanh(softplus(x)); }

float MishModule::derivative(float x) const {
  // d/dx x tanh(sp(x)) = tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2)
  const float t = std::tanh(softplus(x));
  return t + x * sigmoid(x) * (1.0f - t * t);
}

}  // namespace cyxwiz::nn
