// DropoutModule(p): in training, zero each element with probability p and scale the rest by 1/(1-p)
// (inverted dropout, as PyTorch); in eval mode, the identity. Masks come from the global generator.
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class DropoutModule : public Module {
 public:
  explicit DropoutModule(double p = 0.5);

  std::string typeName() const override { return "DropoutModule"; }
  bool canDecode() const override { return true; }  // acts on each position alone
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  ModuleSpec spec() const override { return {typeName(), {{"p", p_}}}; }
  std::string repr() const override;
  double p() const { return p_; }

  // For a step captured into a CUDA graph (ddp/graphed_step.h), as Optimizer's graph scalars: while
  // capturing, the GPU kernel reads its seed from a device buffer instead of drawing one; before each
  // replay, prepareReplay() makes the draw an eager forward would make (from the global generator, in
  // the same order) and writes it there. So a graphed step draws the masks an eager one would.
  void enableGraphSeed(const Device& device);
  void disableGraphSeed();
  void setCapturing(bool capturing) { capturing_ = capturing && graphSeed_.defined(); }
  void prepareReplay();

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
  Tensor graphSeed_;           // int64 holding the uint64 seed, on the model's device
  bool capturing_ = false;
  bool capturedActive_ = false;  // the captured forward drew a mask (training, p > 0)
};

}  // namespace cyxwiz::nn
