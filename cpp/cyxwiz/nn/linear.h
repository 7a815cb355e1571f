// LinearModule: y = x W^T + b, W of shape (out_features, in_features) as in PyTorch, over the last
// dimension of any input (..., in) -> (..., out): the leading dimensions are rows of one product.
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class LinearModule : public Module {
 public:
  LinearModule(int64_t inFeatures, int64_t outFeatures, bool bias = true);

  std::string typeName() const override { return "LinearModule"; }
  bool canDecode() const override { return true; }  // acts on each position alone
  Tensor forward(const Tensor& input) override;
  // forward, then ReLU, in one call (a cuBLASLt epilogue on a GPU); SequentialModel uses it for a
  // LinearModule followed by a ReLUModule.
  Tensor forward(const Tensor& input, bool relu);
  // After an autocast forward, an engine-owned gradOutput that only the caller holds (what the next
  // layer's backward returned) is rounded to 16 bits in place: the caller must not read it after.
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override;
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;

  int64_t inFeatures() const { return in_; }
  int64_t outFeatures() const { return out_; }
  bool hasBias() const { return hasBias_; }
  // Kaiming-uniform weights and uniform bias in +-1/sqrt(in_features), as torch.nn.Linear.
  void resetParameters();

  std::vector<Tensor> savedTensors() const override {
    std::vector<Tensor> saved;
    if (input_.defined()) saved.push_back(input_);
    if (weight16_.defined()) saved.push_back(weight16_);
    return saved;
  }

 protected:
  void clearCache() override {
    input_ = Tensor();
    weight16_ = Tensor();
    inputShape_.clear();
  }

 private:
  // The product over rows: input (rows, in) -> (rows, out).
  Tensor forwardRows(const Tensor& input, bool relu);
  Tensor backwardRows(const Tensor& gradOutput);
  // Under autocast (nn/autocast.h): 16-bit operands, float32 accumulation, the 16-bit input kept.
  Tensor forward16(const Tensor& input, bool relu, DType dtype);
  Tensor backward16(const Tensor& gradOutput);
  Tensor backward16Gpu(const Tensor& gradOutput, DType dtype);

  int64_t in_, out_;
  bool hasBias_;
  Parameter weight_, bias_;
  Tensor input_;  // cached by forward, as rows: float32, or its 16-bit copy under autocast
  Shape inputShape_;  // what forward was given (rows of more than 2 dimensions are flattened)
  Tensor weight16_;  // autocast on a GPU: the weight's 16-bit copy forward multiplied with, for dx
};

}  // namespace cyxwiz::nn
