// DropoutModule(p): in training, zero each element with probability p and scale the rest by 1/(1-p)
// (inverted dropout, as PyTorch); in eval mode, the identity. Masks come from the global generator.
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class DropoutModule : public Module {
 public:
  explicit DropoutModule(double p = 0.5);

  std::string typeName() const override { return "DropoutModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  ModuleSpec spec() const override { return {typeName(), {{"p", p_}}}; }
  std::string repr() const override;
  double p() const { return p_; }

 protected:
  void clearCache() override {
    mask_ = Tensor();
    ranForward_ = false;
  }

 private:
  double p_;
  Tensor mask_;  // 0 or 1/(1-p) per element; undefined when forward ran as the identity
  Shape shape_;
  bool ranForward_ = false;
};

}  // namespace cyxwiz::nn
