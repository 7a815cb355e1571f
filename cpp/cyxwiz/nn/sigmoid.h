// SigmoidModule: y = 1 / (1 + exp(-x)); dy/dx = y (1 - y), y recomputed from the cached input.
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class SigmoidModule : public Module {
 public:
  std::string typeName() const override { return "SigmoidModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;
};

}  // namespace cyxwiz::nn
