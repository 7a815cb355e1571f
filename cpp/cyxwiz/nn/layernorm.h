// LayerNormModule: normalisation over the trailing dimensions of each sample, as torch.nn.LayerNorm:
// y = (x - mean) / sqrt(var + eps) * weight + bias, mean and biased variance over the last
// numel(normalized_shape) values; weight (ones) and bias (zeros) of shape normalized_shape. CPU and GPU
// kernels (the GPU's: a block per row, statistics in double; float32 under autocast on both).
#pragma once

#include <vector>

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class LayerNormModule : public Module {
 public:
  explicit LayerNormModule(Shape normalizedShape, double eps = 1e-5);

  std::string typeName() const override { return "LayerNormModule"; }
  bool canDecode() const override { return true; }  // acts on each position alone
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  std::vector<Tensor> savedTensors() const override { return input_.defined() ? std::vector<Tensor>{input_} : std::vector<Tensor>{}; }

  const Shape& normalizedShape() const { return shape_; }
  double eps() const { return eps_; }

 protected:
  void clearCache() override {
    input_ = Tensor();
    mean_.clear();
    rstd_.clear();
    gpuMean_ = gpuRstd_ = Tensor();
  }

 private:
  Shape shape_;
  int64_t width_;  // values normalised together: the product of shape_
  double eps_;
  Parameter weight_, bias_;
  Tensor input_;
  std::vector<float> mean_, rstd_;  // per normalised row, from forward
  Tensor gpuMean_, gpuRstd_;        // the same on the GPU

  Tensor forwardGpu(const Tensor& input);
  Tensor backwardGpu(const Tensor& gradOutput);
};

}  // namespace cyxwiz::nn
