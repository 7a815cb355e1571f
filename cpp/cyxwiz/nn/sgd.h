// SGDOptimizer, with torch.optim.SGD's semantics (dampening 0):
//   g += weight_decay * p;  buf = momentum * buf + g;  g = nesterov ? g + momentum * buf : buf;  p -= lr * g
#pragma once

#include "cyxwiz/nn/optimizer.h"

namespace cyxwiz::nn {

class SGDOptimizer : public Optimizer {
 public:
  SGDOptimizer(double lr, double momentum = 0.0, double weightDecay = 0.0, bool nesterov = false);
  std::string typeName() const override { return "SGDOptimizer"; }
  std::string repr() const override;

 protected:
  std::vector<std::string> slotNames() const override;
  void update(const Span& span) override;
  void updateOnDevice(const Device& device, const std::vector<cuda::OptimizerTensor>& tensors) override;
  std::vector<float> stepScalars() const override { return {static_cast<float>(lr_)}; }
  void hyperParameters(std::map<std::string, double>& out) const override;

 private:
  double momentum_, weightDecay_;
  bool nesterov_;
};

}  // namespace cyxwiz::nn
