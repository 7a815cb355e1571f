// ReLUModule: y = max(x, 0); dy/dx = 1 where x > 0 (0 at the kink, as PyTorch).
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class ReLUModule : public Module {
 public:
  std::string typeName() const override { return "ReLUModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;
};

}  // namespace cyxwiz::nn
