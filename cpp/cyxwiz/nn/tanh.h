// TanhModule: y = tanh(x); dy/dx = 1 - y^2, y recomputed from the cached input.
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class TanhModule : public Module {
 public:
  std::string typeName() const override { return "TanhModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;
};

}  // namespace cyxwiz::nn
