#include "cyxwiz/nn/linear.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/nn/autocast.h"
#include "cyxwiz/nn/linear16.h"
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

Tensor LinearModule::forward(const Tensor& input) { return forward(input, false); }

Tensor LinearModule::forward(const Tensor& input, bool relu) {
  requireMatrix(input, repr() + ".forward", in_);
  const Device device = weight_.value.device();
  if (const std::optional<DType> dtype = autocastDtype()) return forward16(input, relu, *dtype);
  const Tensor x = input.to(device);  // numpy input of a GPU layer: copied once, here at the edge
  const int64_t batch = x.size(0);
  Tensor output = Tensor::empty({batch, out_}, DType::Float32, device);
  ops::linearForward(device, x.deviceData<float>(), weight_.value.deviceData<float>(),
                     hasBias_ ? bias_.value.deviceData<float>() : nullptr, output.deviceData<float>(), batch, in_,
                     out_, relu);
  input_ = keepForBackward(x);
  return output;
}

Tensor LinearModule::backward(const Tensor& gradOutput) {
  requireForward(input_);
  checkBackward(input_, gradOutput, {input_.size(0), out_});
  if (input_.dtype() != DType::Float32) return backward16(gradOutput);
  const Device device = weight_.value.device();
  const Tensor gt = gradOutput.to(device);
  const int64_t batch = input_.size(0);
  const float* g = gt.deviceData<float>();
  // dW += g^T x ; the GEMM's beta = 1 is the accumulation.
  ops::gemm(device, true, false, out_, in_, batch, 1.0f, g, out_, input_.deviceData<float>(), in_, 1.0f,
            weight_.grad.deviceData<float>(), in_);
  if (hasBias_) ops::addColumnSums(device, g, bias_.grad.deviceData<float>(), batch, out_);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  // dx = g W
  Tensor gradInput = Tensor::empty({batch, in_}, DType::Float32, device);
  ops::gemm(device, false, false, batch, in_, out_, 1.0f, g, out_, weight_.value.deviceData<float>(), in_, 0.0f,
            gradInput.deviceData<float>(), in_);
  return gradInput;
}

// Under autocast (nn/autocast.h): 16-bit input and weight, float32 accumulation; the 16-bit input is kept.
Tensor LinearModule::forward16(const Tensor& input, bool relu, DType dtype) {
  if (weight_.value.isCuda()) {
    throw InvalidArgument(makeString(repr(), " on ", weight_.value.device().str(), ": autocast (mixed precision) runs "
                                     "on the CPU only in this version; train this GPU model in float32 (leave "
                                     "cx.autocast / mixed_precision off) or move the model to the CPU"));
  }
  input_ = Tensor();  // the last step's copy goes before this step's buffers are made: a lower peak
  const Tensor x16 = narrowActivation(input, dtype);  // the copy a fused ReLU before us made, if any
  Tensor output = Tensor::empty({x16.size(0), out_});
  linearForward16(x16, weight_.value.data<float>(), hasBias_ ? bias_.value.data<float>() : nullptr,
                  output.data<float>(), out_, relu);
  input_ = x16;
  return output;
}

Tensor LinearModule::backward16(const Tensor& gradOutput) {
  CYX_CHECK(!weight_.value.isCuda() && !gradOutput.isCuda(), repr(), ".backward: a 16-bit (autocast) forward's "
            "backward runs on the CPU only");
  const DType dtype = input_.dtype();
  const Tensor gr = roundGradient16(gradOutput, dtype);
  linearParamGrads16(input_, gr, weight_.grad.data<float>(), hasBias_ ? bias_.grad.data<float>() : nullptr);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  return linearInputGrad16(gr, weight_.value.data<float>(), in_, dtype);
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
