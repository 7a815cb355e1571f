// ReLUModule: y = max(x, 0); dy/dx = 1 where x > 0 (0 at the kink, as PyTorch).
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class ReLUModule : public Module {
 public:
  std::string typeName() const override { return "ReLUModule"; }
  bool canDecode() const override { return true; }  // acts on each position alone
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  // For a ReLU fused into the layer before it: the derivative at the input equals the derivative at
  // the output (both are "x > 0"), so the fused output can stand in as the saved input. Under
  // autocast (nn/autocast.h) the ReLU keeps the output's 16-bit copy instead and offers it to the
  // next LinearModule, which would make the same copy: the pair keeps one 16-bit activation.
  void keepOutputAsInput(const Tensor& output);

  std::vector<Tensor> savedTensors() const override {
    if (!input_.defined()) return {};
    return {input_};
  }

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  // `offer`: the output of a fused LinearModule, whose 16-bit copy the next LinearModule may share.
  Tensor keep(const Tensor& x, bool offer);
  Tensor input_;  // float32, or a 16-bit copy under autocast (its sign is the mask)
};

}  // namespace cyxwiz::nn
