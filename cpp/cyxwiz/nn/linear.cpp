#include "cyxwiz/nn/linear.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/device/ops16.h"
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
  fillUniform(weight_.value.data<float>(), weight_.value.numel(), bound, globalGenerator());
  if (hasBias_) fillUniform(bias_.value.data<float>(), out_, bound, globalGenerator());
}

Tensor LinearModule::forward(const Tensor& input) { return forward(input, false); }

namespace {

// `t` as rows of its last dimension (a view).
Tensor asRows(const Tensor& t) {
  const int64_t last = t.size(t.dim() - 1);
  return t.dim() == 2 ? t : t.reshape({last ? t.numel() / last : 0, last});
}

}  // namespace

Tensor LinearModule::forward(const Tensor& input, bool relu) {
  const std::string who = repr() + ".forward";
  if (input.dtype() != DType::Float32) throw TypeMismatch(makeString(who, ": expected float32 input, got ", dtypeName(input.dtype())));
  if (input.dim() < 2 || input.size(input.dim() - 1) != in_) {
    throw InvalidArgument(makeString(who, ": expected input of shape (batch, ", in_, ") or (..., ", in_, "), got ",
                                     shapeString(input.shape())));
  }
  inputShape_ = input.shape();
  const Tensor out = forwardRows(asRows(input), relu);
  if (input.dim() == 2) return out;
  Shape shape = input.shape();
  shape.back() = out_;
  return out.reshape(shape);
}

Tensor LinearModule::forwardRows(const Tensor& input, bool relu) {
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
  Shape expected = inputShape_;
  expected.back() = out_;
  checkBackward(input_, gradOutput, expected);
  const Tensor gradInput = backwardRows(asRows(gradOutput));
  return gradInput.defined() && inputShape_.size() != 2 ? gradInput.reshape(inputShape_) : gradInput;
}

Tensor LinearModule::backwardRows(const Tensor& gradOutput) {
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
  const Device device = weight_.value.device();
  input_ = Tensor();  // the last step's copies go before this step's buffers are made: a lower peak
  weight16_ = Tensor();
  // The copy a fused ReLU before us made, if any (numpy input of a GPU layer: copied once, here).
  const Tensor x16 = narrowActivation(input.to(device), dtype);
  const float* bias = hasBias_ ? bias_.value.deviceData<float>() : nullptr;
  Tensor output = Tensor::empty({x16.size(0), out_}, DType::Float32, device);
  if (device.type == DeviceType::CUDA) {
    // The weight's 16-bit copy (a cast kernel), kept for backward's dx: cast once a step.
    weight16_ = ops::narrowOnDevice(weight_.value, dtype);
    ops::linearForward16(x16, weight16_, bias, output, relu);
  } else {
    linearForward16(x16, weight_.value.data<float>(), bias, output.data<float>(), out_, relu);
  }
  input_ = x16;
  return output;
}

Tensor LinearModule::backward16(const Tensor& gradOutput) {
  const DType dtype = input_.dtype();
  if (input_.isCuda()) return backward16Gpu(gradOutput, dtype);
  CYX_CHECK(!weight_.value.isCuda() && !gradOutput.isCuda(), repr(), ".backward: the 16-bit (autocast) forward ran "
            "on the CPU and the gradient or the weight is on a GPU; run forward and backward on one device");
  const Tensor gr = roundGradient16(gradOutput, dtype);
  linearParamGrads16(input_, gr, weight_.grad.data<float>(), hasBias_ ? bias_.grad.data<float>() : nullptr);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  return linearInputGrad16(gr, weight_.value.data<float>(), in_, dtype);
}

// As the CPU's backward16, on the device: the gradient rounded once into a 16-bit buffer (a cast
// kernel), the operand of both GEMMs and the bias gradient's column sums.
Tensor LinearModule::backward16Gpu(const Tensor& gradOutput, DType dtype) {
  const Device device = input_.device();
  const int64_t batch = input_.size(0);
  const Tensor g16 = ops::narrowOnDevice(gradOutput.to(device), dtype);
  // dW += g16^T x16 ; db += colsum(g16)
  ops::gemm16(device, dtype, true, false, out_, in_, batch, 1.0f, g16, out_, input_, in_, 1.0f,
              weight_.grad.deviceData<float>(), in_);
  if (hasBias_) ops::addColumnSums16(g16, bias_.grad.deviceData<float>());
  gradsReady();
  const Tensor w16 = std::move(weight16_);  // released when this returns, whatever it returns
  weight16_ = Tensor();
  if (!needInputGrad_) return Tensor();
  CYX_CHECK(w16.defined(), repr(), ".backward: the 16-bit weight copy of the autocast forward is gone (a second "
            "backward after one forward?); run forward again before backward");
  // dx = g16 w16
  Tensor gradInput = Tensor::empty({batch, in_}, DType::Float32, device);
  ops::gemm16(device, dtype, false, false, batch, in_, out_, 1.0f, g16, out_, w16, in_, 0.0f,
              gradInput.deviceData<float>(), in_);
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

Shape LinearModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, out_};
  if (input.size() < 2) {
    throw InvalidArgument(makeString(repr(), " expects input (N, ", in_, ") or (..., ", in_, "), got ", describeShape(input)));
  }
  const int64_t last = input.back();
  CYX_CHECK(last < 0 || last == in_, repr(), " cannot follow a layer with ", last, " outputs: it expects input (N, ", in_,
            ") or (..., ", in_, ") (the last dimension), got ", describeShape(input),
            input.size() > 2 ? "; put a FlattenModule before it to take the whole sample" : "");
  Shape out = input;
  out.back() = out_;
  return out;
}

}  // namespace cyxwiz::nn
