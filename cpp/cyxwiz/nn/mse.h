// MSELoss: mean over all elements of (output - target)^2, as torch.nn.MSELoss(reduction="mean");
// gradient 2 (output - target) / numel.
#pragma once

#include "cyxwiz/nn/loss.h"

namespace cyxwiz::nn {

class MSELoss : public Loss {
 public:
  std::string typeName() const override { return "MSELoss"; }
  double forward(const Tensor& output, const Tensor& target) override;
  Tensor backward(const Tensor& output, const Tensor& target) override;
  bool takesClassIndices() const override { return false; }
};

}  // namespace cyxwiz::nn
