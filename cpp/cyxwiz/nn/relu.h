// ReLUModule: y = max(x, 0); dy/dx = 1 where x > 0 (0 at the kink, as PyTorch).
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class ReLUModule : public Module {
 public:
  std::string typeName() const override { return "ReLUModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  // For a ReLU fused into the layer before it: the derivative at the input equals the derivative at
  // the output (both are "x > 0"), so the fused output can stand in as the saved input.
  void keepOutputAsInput(const Tensor& output) { input_ = output; }

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;
};

}  // namespace cyxwiz::nn
