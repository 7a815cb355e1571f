// AdamOptimizer and AdamWOptimizer, with torch.optim.Adam / AdamW's update (amsgrad off):
//   Adam:  g += weight_decay * p                       (L2 penalty in the gradient)
//   AdamW: p *= 1 - lr * weight_decay                  (decoupled decay, Loshchilov & Hutter)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// One fused pass over p, g, m, v per parameter.
#pragma once

#include "cyxwiz/nn/optimizer.h"

namespace cyxwiz::nn {

class AdamOptimizer : public Optimizer {
 public:
  AdamOptimizer(double lr = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weightDecay = 0.0);
  std::string typeName() const override { return "AdamOptimizer"; }
  std::string repr() const override;

 protected:
  AdamOptimizer(double lr, double beta1, double beta2, double eps, double weightDecay, bool decoupled);
  std::vector<std::string> slotNames() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(const Span& span) override;
  void updateOnDevice(const Device& device, const std::vector<cuda::OptimizerTensor>& tensors) override;
  std::vector<float> stepScalars() const override;
  void hyperParameters(std::map<std::string, double>& out) const override;

  double beta1_, beta2_, eps_, weightDecay_;
  bool decoupled_;
};

class AdamWOptimizer : public AdamOptimizer {
 public:
  AdamWOptimizer(double lr = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weightDecay = 0.01)
      : AdamOptimizer(lr, beta1, beta2, eps, weightDecay, true) {}
  std::string typeName() const override { return "AdamWOptimizer"; }
};

}  // namespace cyxwiz::nn
