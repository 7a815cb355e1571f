#include "cyxwiz/nn/linear.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

LinearModule::LinearModule(int64_t inFeatures, int64_t outFeatures, bool bias)
    : in_(inFeatures), out_(outFeatures), hasBias_(bias) {
  CYX_CHECK(inFeatures > 0 && outFeatures > 0, "LinearModule(in_features=", inFeatures, ", out_features=", outFeatures,
            "): both must be positive");
  weight_ = {"weight", Tensor::empty({out_, in_}), Tensor::zeros({out_, in_})};
  if (hasBias_) bias_ = {"bias", Tensor::empty({out_}), Tensor::zeros({out_})};
  resetParameters();
}

void LinearModule::resetParameters() {
  // kaiming_uniform_(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same bound.
  float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  auto& gen = globalGenerator();
  float* w = weight_.value.data<float>();
  for (int64_t i = 0; i < weight_.value.numel(); ++i) w[i] = (2.0f * uniform01(gen) - 1.0f) * bound;
  if (hasBias_) {
    float* b = bias_.value.data<float>();
    for (int64_t i = 0; i < out_; ++i) b[i] = (2.0f * uniform01(gen) - 1.0f) * bound;
  }
}

Tensor LinearModule::forward(const Tensor& input) {
  requireMatrix(input, repr() + ".forward", in_);
  const int64_t batch = input.size(0);
  Tensor output = Tensor::empty({batch, out_});
  float* y = output.data<float>();
  // Seed each row with the bias, then let the GEMM accumulate onto it (beta = 1): no separate pass.
  if (hasBias_) {
    const float* b = bias_.value.data<float>();
    for (int64_t r = 0; r < batch; ++r) std::copy(b, b + out_, y + r * out_);
  }
  blas::sgemm(false, true, batch, out_, in_, 1.0f, input.data<float>(), in_, weight_.value.data<float>(), in_,
              hasBias_ ? 1.0f : 0.0f, y, out_);
  input_ = keepForBackward(input);
  return output;
}

Tensor LinearModule::backward(const Tensor& gradOutput) {
  requireForward(input_);
  checkBackward(input_, gradOutput, {input_.size(0), out_});
  const int64_t batch = input_.size(0);
  const float* g = gradOutput.data<float>();
  // dW += g^T x ; the GEMM's beta = 1 is the accumulation.
  blas::sgemm(true, false, out_, in_, batch, 1.0f, g, out_, input_.data<float>(), in_, 1.0f,
              weight_.grad.data<float>(), in_);
  if (hasBias_) {
    float* db = bias_.grad.data<float>();
    for (int64_t r = 0; r < batch; ++r) {
      const float* row = g + r * out_;
      for (int64_t j = 0; j < out_; ++j) db[j] += row[j];
    }
  }
  gradsReady();
  if (!needInputGrad_) return Tensor();
  // dx = g W
  Tensor gradInput = Tensor::empty({batch, in_});
  blas::sgemm(false, false, batch, in_, out_, 1.0f, g, out_, weight_.value.data<float>(), in_, 0.0f,
              gradInput.data<float>(), in_);
  return gradInput;
}

std::vector<Parameter*> LinearModule::parameters() {
  if (hasBias_) return {&weight_, &bias_};
  return {&weight_};
}

ModuleSpec LinearModule::spec() const {
  return {typeName(), {{"in_features", double(in_)}, {"out_features", double(out_)}, {"bias", hasBias_ ? 1.0 : 0.0}}};
}

std::string LinearModule::repr() const {
  return makeString("LinearModule(in_features=", in_, ", out_features=", out_, ", bias=", hasBias_ ? "True" : "False", ")");
}

int64_t LinearModule::outFeatures(int64_t inFeatures) const {
  CYX_CHECK(inFeatures < 0 || inFeatures == in_, repr(), " cannot follow a layer with ", inFeatures, " outputs");
  return out_;
}

}  // namespace cyxwiz::nn
