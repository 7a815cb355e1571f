#include "cyxwiz/nn/positional.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

PositionalEncodingModule::PositionalEncodingModule(int64_t maxLen, int64_t dim, bool learned)
    : maxLen_(maxLen), dim_(dim), learned_(learned) {
  CYX_CHECK(maxLen > 0 && dim > 0, "PositionalEncodingModule(max_len=", maxLen, ", dim=", dim, "): both must be positive");
  if (learned_) {
    weight_ = {"weight", Tensor::empty({maxLen_, dim_}), Tensor::zeros({maxLen_, dim_})};
    float* w = weight_.value.data<float>();
    fillNormal(w, weight_.value.numel(), globalGenerator());
    for (int64_t i = 0; i < weight_.value.numel(); ++i) w[i] *= 0.02f;
    return;
  }
  table_ = Tensor::empty({maxLen_, dim_});
  float* pe = table_.data<float>();
  for (int64_t p = 0; p < maxLen_; ++p) {
    for (int64_t i = 0; i < dim_; i += 2) {
      // In double: the angles reach max_len radians, where float32 would lose the low positions' bits.
      const double angle = static_cast<double>(p) / std::pow(10000.0, static_cast<double>(i) / static_cast<double>(dim_));
      pe[p * dim_ + i] = static_cast<float>(std::sin(angle));
      if (i + 1 < dim_) pe[p * dim_ + i + 1] = static_cast<float>(std::cos(angle));
    }
  }
}

Shape PositionalEncodingModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, -1, dim_};
  if (input.size() != 3 || (input[2] >= 0 && input[2] != dim_) || input[1] > maxLen_) {
    throw InvalidArgument(makeString(repr(), " expects input (N, T, ", dim_, ") with T <= ", maxLen_, ", got ",
                                     describeShape(input)));
  }
  return input;
}

Tensor PositionalEncodingModule::forward(const Tensor& input) {
  requireInput(input, repr() + ".forward", 3, "(N, T, D)");
  outputShape(input.shape());
  const int64_t N = input.size(0), TD = input.size(1) * dim_;
  const Tensor& table = learned_ ? weight_.value : table_;
  if (table.isCuda()) {
    // y = pe[:T] broadcast over the batch, then y = x + y: the CPU's sums, element by element.
    const Device device = table.device();
    const Tensor x = input.to(device);
    Tensor output = Tensor::empty(x.shape(), DType::Float32, device);
    float* y = output.deviceData<float>();
    ops::broadcastRows(device, table.deviceData<float>(), y, N, TD);
    CYX_CUDA(add(device.index, x.deviceData<float>(), y, y, N * TD));
    inputShape_ = input.shape();
    return output;
  }
  CYX_CHECK(!input.isCuda(), repr(), ".forward: the input is on ", input.device().str(),
            " and the module on the CPU; move the model (model.to) or the input to one device");
  const float* pe = table.data<float>();
  const float* x = input.data<float>();
  Tensor output = Tensor::empty(input.shape());
  float* y = output.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < TD; ++i) y[n * TD + i] = x[n * TD + i] + pe[i];
  }
  inputShape_ = input.shape();
  return output;
}

Tensor PositionalEncodingModule::decode(const Tensor& input, int64_t position) {
  requireInput(input, repr() + ".decode", 3, "(N, T, D)");
  const int64_t N = input.size(0), T = input.size(1);
  CYX_CHECK(input.size(2) == dim_ && position >= 0 && position + T <= maxLen_, repr(), ".decode: positions ", position,
            "..", position + T - 1, " of (N, T, ", dim_, ") input ", shapeString(input.shape()), " do not fit max_len ", maxLen_);
  const Tensor& table = learned_ ? weight_.value : table_;
  CYX_CHECK(!input.isCuda() && !table.isCuda(), repr(), ".decode runs on the CPU");
  const float* pe = table.data<float>() + position * dim_;
  const float* x = input.data<float>();
  Tensor output = Tensor::empty(input.shape());
  float* y = output.data<float>();
  const int64_t TD = T * dim_;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < TD; ++i) y[n * TD + i] = x[n * TD + i] + pe[i];
  }
  return output;
}

Tensor PositionalEncodingModule::backward(const Tensor& gradOutput) {
  if (inputShape_.empty()) throw InvalidArgument(repr() + ".backward called before forward; run forward on the batch first");
  if (gradOutput.dtype() != DType::Float32 || gradOutput.shape() != inputShape_) {
    throw InvalidArgument(makeString(repr(), ".backward: expected a float32 gradient of shape ", shapeString(inputShape_),
                                     ", got ", dtypeName(gradOutput.dtype()), " ", shapeString(gradOutput.shape())));
  }
  if (learned_ && weight_.value.isCuda()) {
    // The batch's sum per position: deterministic column sums (kernels_elementwise.cu).
    const Device device = weight_.value.device();
    const Tensor g = gradOutput.to(device);
    ops::addColumnSums(device, g.deviceData<float>(), weight_.grad.deviceData<float>(), inputShape_[0],
                       inputShape_[1] * dim_);
  } else if (learned_) {
    const int64_t N = inputShape_[0], TD = inputShape_[1] * dim_;
    const float* g = gradOutput.data<float>();
    float* dw = weight_.grad.data<float>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < TD; ++i) dw[i] += g[n * TD + i];
    }
  }
  gradsReady();
  if (!needInputGrad_) return Tensor();
  return gradOutput.clone();
}

void PositionalEncodingModule::to(const Device& device) {
  Module::to(device);
  if (!learned_) table_ = table_.to(device);
}

std::vector<Parameter*> PositionalEncodingModule::parameters() {
  if (learned_) return {&weight_};
  return {};
}

ModuleSpec PositionalEncodingModule::spec() const {
  return {typeName(), {{"max_len", double(maxLen_)}, {"dim", double(dim_)}, {"learned", learned_ ? 1.0 : 0.0}}};
}

std::string PositionalEncodingModule::repr() const {
  return makeString("PositionalEncodingModule(max_len=", maxLen_, ", dim=", dim_, learned_ ? ", learned=True" : "", ")");
}

}  // namespace cyxwiz::nn
