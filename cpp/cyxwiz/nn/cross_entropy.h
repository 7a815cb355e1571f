// CrossEntropyLoss on raw logits: mean over rows of -sum_c p_c log softmax(x)_c, with p the one-hot
// of the class index or the given probability row. log-softmax is computed as x - max - log(sum exp(x - max)),
// so large logits neither overflow nor lose the loss to rounding. As torch's: a class index equal to
// ignore_index (-100 unless set; none: std::nullopt) leaves its row out of the sum and of the mean's count,
// and its gradient is 0; a batch with every row ignored has a NaN mean (0 / 0).
#pragma once

#include "cyxwiz/nn/loss.h"

namespace cyxwiz::nn {

class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(IgnoreIndex ignoreIndex = -100) : ignore_(ignoreIndex) {}
  std::string typeName() const override { return "CrossEntropyLoss"; }
  IgnoreIndex ignoreIndex() const override { return ignore_; }
  void checkTarget(const Shape& outputShape, const Tensor& target, const std::string& who) const override;
  void addLossSum(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index) const override;
  // (softmax(x) * sum_c p_c - p) / rows
  Tensor gradient(const Tensor& output, const Tensor& target) const override;
  bool takesClassIndices() const override { return true; }
  // Every position of (N, T, classes) logits that is not ignored: as torch's mean.
  int64_t terms(const Shape& outputShape, const Tensor& target) const override;

 private:
  IgnoreIndex ignore_;
};

}  // namespace cyxwiz::nn
