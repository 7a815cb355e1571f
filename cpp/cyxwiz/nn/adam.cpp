#include "cyxwiz/nn/adam.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/platform/cpu.h"

namespace cyxwiz::nn {

namespace {

// Cloned per instruction set and picked at load time: one build runs well on any x86-64 (platform/cpu.h).
CYXWIZ_CPU_CLONES
void adamKernel(float* __restrict p, const float* __restrict grad, float* __restrict m, float* __restrict v, int64_t n,
                float stepSize, float b1, float b2, float eps, float invSqrtBc2, float l2, float decay) {
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] + l2 * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    p[i] = p[i] * decay - stepSize * m[i] / (std::sqrt(v[i]) * invSqrtBc2 + eps);
  }
}

}  // namespace

AdamOptimizer::AdamOptimizer(double lr, double beta1, double beta2, double eps, double weightDecay)
    : AdamOptimizer(lr, beta1, beta2, eps, weightDecay, false) {}

AdamOptimizer::AdamOptimizer(double lr, double beta1, double beta2, double eps, double weightDecay, bool decoupled)
    : Optimizer(lr), beta1_(beta1), beta2_(beta2), eps_(eps), weightDecay_(weightDecay), decoupled_(decoupled) {
  const std::string who = decoupled ? "AdamWOptimizer" : "AdamOptimizer";
  checkHyperParameter(beta1 >= 0.0 && beta1 < 1.0, who, "beta1", beta1, "it must be in [0, 1)");
  checkHyperParameter(beta2 >= 0.0 && beta2 < 1.0, who, "beta2", beta2, "it must be in [0, 1)");
  checkHyperParameter(eps >= 0.0, who, "eps", eps, "it must be >= 0");
  checkHyperParameter(weightDecay >= 0.0, who, "weight_decay", weightDecay, "it must be >= 0");
}

std::string AdamOptimizer::repr() const {
  return makeString(typeName(), "(lr=", lr_, ", beta1=", beta1_, ", beta2=", beta2_, ", eps=", eps_,
                    ", weight_decay=", weightDecay_, ")");
}

void AdamOptimizer::hyperParameters(std::map<std::string, double>& out) const {
  out["beta1"] = beta1_;
  out["beta2"] = beta2_;
  out["eps"] = eps_;
  out["weight_decay"] = weightDecay_;
}

std::vector<float> AdamOptimizer::stepScalars() const {
  const double t = static_cast<double>(steps_);
  const double bc1 = 1.0 - std::pow(beta1_, t);
  const double bc2 = 1.0 - std::pow(beta2_, t);
  const float decay = decoupled_ ? static_cast<float>(1.0 - lr_ * weightDecay_) : 1.0f;
  return {static_cast<float>(lr_ / bc1), static_cast<float>(1.0 / std::sqrt(bc2)), decay};  // stepSize, invSqrtBc2, decay
}

void AdamOptimizer::updateOnDevice(const Device& device, const std::vector<cuda::OptimizerTensor>& tensors) {
  const std::vector<float> k = stepScalars();
  const float l2 = decoupled_ ? 0.0f : static_cast<float>(weightDecay_);
  CYX_CUDA(adamStep(device.index, tensors.data(), static_cast<int>(tensors.size()), k[0], static_cast<float>(beta1_),
                    static_cast<float>(beta2_), static_cast<float>(eps_), k[1], l2, k[2], graphScalars()));
}

void AdamOptimizer::update(const Span& span) {
  const std::vector<float> k = stepScalars();
  const float stepSize = k[0], invSqrtBc2 = k[1], decay = k[2];
  const float l2 = decoupled_ ? 0.0f : static_cast<float>(weightDecay_);
  adamKernel(span.value, span.grad, span.slots[0], span.slots[1], span.n, stepSize, static_cast<float>(beta1_), static_cast<float>(beta2_),
             static_cast<float>(eps_), invSqrtBc2, l2, decay);
}

}  // namespace cyxwiz::nn
