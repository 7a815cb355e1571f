// SoftmaxModule: softmax over the last axis, y_i = exp(x_i - max) / sum_j exp(x_j - max);
// backward: dx = y * (g - sum(g * y)) per row. (CrossEntropyLoss takes raw logits: do not put
// this before it; it is for models that must output probabilities.)
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class SoftmaxModule : public Module {
 public:
  std::string typeName() const override { return "SoftmaxModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 protected:
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;
};

// Row-wise softmax of a (rows, cols) float buffer into another (they must not overlap), shared with
// CrossEntropyLoss.
void softmaxRows(const float* x, float* y, int64_t rows, int64_t cols);
// log sum_c e^(x_c) of one row of n > 0 logits, max-shifted; `scratch` (n floats) takes the exps.
double logSumExpRow(const float* x, float* scratch, int64_t n);

}  // namespace cyxwiz::nn
