#include "cyxwiz/nn/sgd.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::nn {

SGDOptimizer::SGDOptimizer(double lr, double momentum, double weightDecay, bool nesterov)
    : Optimizer(lr), momentum_(momentum), weightDecay_(weightDecay), nesterov_(nesterov) {
  checkHyperParameter(momentum >= 0.0, "SGDOptimizer", "momentum", momentum, "it must be >= 0");
  checkHyperParameter(weightDecay >= 0.0, "SGDOptimizer", "weight_decay", weightDecay, "it must be >= 0");
  CYX_CHECK(!nesterov || momentum > 0.0, "SGDOptimizer: nesterov=True needs momentum > 0");
}

std::string SGDOptimizer::repr() const {
  return makeString("SGDOptimizer(lr=", lr_, ", momentum=", momentum_, ", weight_decay=", weightDecay_,
                    ", nesterov=", nesterov_ ? "True" : "False", ")");
}

std::vector<std::string> SGDOptimizer::slotNames() const {
  if (momentum_ > 0.0) return {"momentum_buffer"};
  return {};
}

void SGDOptimizer::hyperParameters(std::map<std::string, double>& out) const {
  out["momentum"] = momentum_;
  out["weight_decay"] = weightDecay_;
  out["nesterov"] = nesterov_;
}

void SGDOptimizer::updateOnDevice(const Device& device, const std::vector<cuda::OptimizerTensor>& tensors) {
  CYX_CUDA(sgdStep(device.index, tensors.data(), static_cast<int>(tensors.size()), static_cast<float>(lr_),
                   static_cast<float>(momentum_), static_cast<float>(weightDecay_), nesterov_, graphScalars()));
}

void SGDOptimizer::update(const Span& span) {
  float* p = span.value;
  const float* grad = span.grad;
  const int64_t n = span.n;
  const float lr = static_cast<float>(lr_), wd = static_cast<float>(weightDecay_), mu = static_cast<float>(momentum_);
  if (span.slots[0] == nullptr) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (grad[i] + wd * p[i]);
    return;
  }
  // A zero buffer makes the first step buf = g, as torch's "first step" rule.
  float* buf = span.slots[0];
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] + wd * p[i];
    buf[i] = mu * buf[i] + g;
    p[i] -= lr * (nesterov_ ? g + mu * buf[i] : buf[i]);
  }
}

}  // namespace cyxwiz::nn
