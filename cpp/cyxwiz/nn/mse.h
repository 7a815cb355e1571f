// MSELoss: mean over all elements of (output - target)^2, as torch.nn.MSELoss(reduction="mean");
// gradient 2 (output - target) / numel.
#pragma once

#include "cyxwiz/nn/loss.h"

namespace cyxwiz::nn {

class MSELoss : public Loss {
 public:
  std::string typeName() const override { return "MSELoss"; }
  void checkTarget(const Shape& outputShape, const Tensor& target, const std::string& who) const override;
  void addLossSum(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index) const override;
  Tensor gradient(const Tensor& output, const Tensor& target) const override;
  bool takesClassIndices() const override { return false; }
};

}  // namespace cyxwiz::nn
