#include "cyxwiz/nn/dropout.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/nn/elementwise.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

DropoutModule::DropoutModule(double p) : p_(p) {
  CYX_CHECK(p >= 0.0 && p < 1.0, "DropoutModule(p=", p, "): p must be in [0, 1)");
}

std::string DropoutModule::repr() const { return makeString("DropoutModule(p=", p_, ")"); }

Tensor DropoutModule::forward(const Tensor& input) {
  requireFloatTensor(input, "DropoutModule.forward");
  shape_ = input.shape();
  ranForward_ = true;
  if (!training_ || p_ == 0.0) {  // the identity, as torch's: the input itself, no copy (a Transformer block
    mask_ = Tensor();                // has three dropouts; copies cost ~12 MiB of a 1024-token step's peak)
    return input;
  }
  mask_ = Tensor::empty(input.shape(), DType::Float32, input.device());
  Tensor out = Tensor::empty(input.shape(), DType::Float32, input.device());
  const float keep = static_cast<float>(1.0 - p_);
  const float scale = 1.0f / keep;
  auto& gen = globalGenerator();
  if (input.isCuda()) {
    // One draw from the global generator seeds the GPU's counter-based stream: manual_seed still
    // makes GPU runs repeatable, though the masks differ from the CPU's. A captured forward draws
    // nothing: prepareReplay draws for each replay.
    if (capturing_) capturedActive_ = true;  // eager forwards between replays leave it as captured
    const uint64_t* seedOnDevice =
        capturing_ ? reinterpret_cast<const uint64_t*>(graphSeed_.deviceData<int64_t>()) : nullptr;
    CYX_CUDA(dropoutForward(input.device().index, input.deviceData<float>(), out.deviceData<float>(),
                            mask_.deviceData<float>(), input.numel(), keep, capturing_ ? 0 : gen(), seedOnDevice));
    return out;
  }
  float* m = mask_.data<float>();
  const float* x = input.data<float>();
  float* y = out.data<float>();
  const int64_t n = input.numel();
  for (int64_t i = 0; i < n; ++i) {
    m[i] = uniform01(gen) < keep ? scale : 0.0f;
    y[i] = x[i] * m[i];
  }
  return out;
}

void DropoutModule::enableGraphSeed(const Device& device) {
  graphSeed_ = Tensor::zeros({1}, DType::Int64, device);
  capturedActive_ = false;
}

void DropoutModule::disableGraphSeed() {
  graphSeed_ = Tensor();
  capturing_ = capturedActive_ = false;
}

void DropoutModule::prepareReplay() {
  if (!capturedActive_) return;  // captured as the identity (eval mode or p = 0): no draw, as eager
  Tensor host = Tensor::empty({1}, DType::Int64);
  host.data<int64_t>()[0] = static_cast<int64_t>(globalGenerator()());
  graphSeed_.copyFrom(host);  // stream-ordered: lands before the replay queued after it
}

Tensor DropoutModule::backward(const Tensor& gradOutput) {
  if (!ranForward_) throw InvalidArgument("DropoutModule.backward called before forward; run forward on the batch first");
  checkBackward(gradOutput, gradOutput, shape_);
  if (!needInputGrad_) return Tensor();
  if (!mask_.defined()) return gradOutput;
  if (gradOutput.isCuda()) {
    ops::requireSameDevice(mask_, gradOutput, "DropoutModule.backward");
    Tensor gradInput = Tensor::empty(gradOutput.shape(), DType::Float32, gradOutput.device());
    CYX_CUDA(multiply(gradOutput.device().index, mask_.deviceData<float>(), gradOutput.deviceData<float>(),
                      gradInput.deviceData<float>(), gradOutput.numel()));
    return gradInput;
  }
  return zipElements(mask_, gradOutput, [](float m, float g) { return g * m; });
}

}  // namespace cyxwiz::nn
