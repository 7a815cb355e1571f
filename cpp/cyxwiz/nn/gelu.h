// GELUModule: exact GELU, y = x * Phi(x) with Phi the standard normal CDF (PyTorch's default,
// approximate='none'); dy/dx = Phi(x) + x * phi(x).
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class GELUModule : public Module {
 public:
  std::string typeName() const override { return "GELUModule"; }
  bool canDecode() const override { return true; }  // acts on each position alone
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;  // the derivative needs x itself
};

}  // namespace cyxwiz::nn
