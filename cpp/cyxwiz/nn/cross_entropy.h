// CrossEntropyLoss on raw logits: mean over rows of -sum_c p_c log softmax(x)_c, with p the one-hot
// of the class index or the given probability row. log-softmax is computed as x - max - log(sum exp(x - max)),
// so large logits neither overflow nor lose the loss to rounding.
#pragma once

#include "cyxwiz/nn/loss.h"

namespace cyxwiz::nn {

class CrossEntropyLoss : public Loss {
 public:
  std::string typeName() const override { return "CrossEntropyLoss"; }
  void checkTarget(const Shape& outputShape, const Tensor& target, const std::string& who) const override;
  void addLossSum(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index) const override;
  // (softmax(x) * sum_c p_c - p) / rows
  Tensor gradient(const Tensor& output, const Tensor& target) const override;
  bool takesClassIndices() const override { return true; }
  // Every position of (N, T, classes) logits: the mean is over N * T, as torch's.
  int64_t terms(const Shape& outputShape) const override {
    int64_t n = 1;
    for (size_t d = 0; d + 1 < outputShape.size(); ++d) n *= outputShape[d];
    return n;
  }
};

}  // namespace cyxwiz::nn
