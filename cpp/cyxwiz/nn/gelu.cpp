#include "cyxwiz/nn/gelu.h"

#include <cmath>

#include "cyxwiz/nn/elementwise.h"
#include "cyxwiz/nn/fast_exp.h"

namespace cyxwiz::nn {

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// Phi(x) = (1 + erf(x / sqrt2)) / 2 from e^(-x^2/2) (passed in: backward needs it too), by Abramowitz and
// Stegun 7.1.26 (|erf error| <= 1.5e-7): erf(z) = 1 - t (a1 + t (a2 + ...)) e^(-z^2), t = 1 / (1 + p z).
inline float normalCdf(float x, float gaussian) {
  const float z = std::fabs(x) * kInvSqrt2;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float tail = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f)))) *
                     gaussian;  // 1 - erf(|z|)
  const float erfAbs = 1.0f - tail;
  return 0.5f * (1.0f + (x < 0.0f ? -erfAbs : erfAbs));
}

}  // namespace

Tensor GELUModule::forward(const Tensor& input) {
  requireFloatTensor(input, "GELUModule.forward");
  input_ = keepForBackward(input);
  return activation(input, cuda::Activation::GELU,
                    [](float x) { return x * normalCdf(x, expNonPositive(-0.5f * x * x)); });
}

Tensor GELUModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  return activationGrad(input_, gradOutput, cuda::Activation::GELU, [](float x, float g) {
    const float gaussian = expNonPositive(-0.5f * x * x);
    return g * (normalCdf(x, gaussian) + x * kInvSqrt2Pi * gaussian);
  });
}

}  // namespace cyxwiz::nn
