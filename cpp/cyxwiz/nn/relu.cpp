#include "cyxwiz/nn/relu.h"

#include "cyxwiz/device/ops16.h"
#include "cyxwiz/nn/autocast.h"
#include "cyxwiz/nn/elementwise.h"
#include "cyxwiz/tensor/half.h"

namespace cyxwiz::nn {

namespace {

// dx = g where the kept 16-bit input is > 0, read from its bits: positive, non-zero and not NaN is
// 1 <= bits <= the type's +inf (0x7F80 bfloat16, 0x7C00 float16). Elsewhere exactly 0 (whatever g
// holds, Inf and NaN included), so the gradient's bits are masked rather than multiplied: one compare
// and one AND an element, which the compiler vectorises (a select on floats stayed a branch, 3.8 ms
// per million random-signed elements); split over the threads.
Tensor maskFrom16(const Tensor& x16, const Tensor& g, uint32_t positiveInfinity) {
  Tensor dx = Tensor::empty(g.shape());
  const auto* x = static_cast<const uint16_t*>(x16.rawData());
  const auto* gi = reinterpret_cast<const uint32_t*>(g.data<float>());  // float32 bits (and a host check)
  auto* out = static_cast<uint32_t*>(dx.rawData());
  parallelFor(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t keep = 0u - static_cast<uint32_t>(static_cast<uint32_t>(x[i]) - 1u < positiveInfinity);
      out[i] = gi[i] & keep;
    }
  });
  return dx;
}

}  // namespace

// Under autocast the saved input is a 16-bit copy (nn/autocast.h), on the CPU or a GPU; else what forward saw.
// Under autocast the last step's copy goes first, before the new one is made (a lower peak).
Tensor ReLUModule::keep(const Tensor& x, bool offer) {
  const std::optional<DType> dtype = autocastDtype();
  if (dtype) {
    input_ = Tensor();
    return narrowActivation(x, *dtype, offer);
  }
  return offer ? x : keepForBackward(x);
}

Tensor ReLUModule::forward(const Tensor& input) {
  requireFloatTensor(input, "ReLUModule.forward");
  input_ = keep(input, false);
  return activation(input, cuda::Activation::ReLU, [](float x) { return x > 0.0f ? x : 0.0f; });
}

void ReLUModule::keepOutputAsInput(const Tensor& output) { input_ = keep(output, true); }

Tensor ReLUModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  if (input_.dtype() != DType::Float32 && input_.isCuda()) {
    ops::requireSameDevice(input_, gradOutput, "ReLUModule.backward");
    Tensor dx = Tensor::empty(gradOutput.shape(), DType::Float32, gradOutput.device());
    ops::reluBackward16(input_, gradOutput, dx);
    return dx;
  }
  if (input_.dtype() == DType::BFloat16) return maskFrom16(input_, gradOutput, 0x7F80);
  if (input_.dtype() == DType::Float16) return maskFrom16(input_, gradOutput, 0x7C00);
  return activationGrad(input_, gradOutput, cuda::Activation::ReLU, [](float x, float g) { return x > 0.0f ? g : 0.0f; });
}

}  // namespace cyxwiz::nn
