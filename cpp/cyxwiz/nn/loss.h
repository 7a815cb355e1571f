// Loss: forward(output, target) -> batch mean; backward(output, target) -> d(mean)/d(output).
//
// Targets are either class indices (int64, shape (N,)) or rows of the output's shape (one-hot or
// probabilities for CrossEntropyLoss, regression targets for MSELoss), float32.
#pragma once

#include <string>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string typeName() const = 0;
  virtual double forward(const Tensor& output, const Tensor& target) = 0;
  virtual Tensor backward(const Tensor& output, const Tensor& target) = 0;
  // True when a 1-D target means class indices (CrossEntropyLoss), false when targets are values
  // of the output's shape (MSELoss): the bindings convert targets accordingly.
  virtual bool takesClassIndices() const = 0;
};

// Fraction of rows whose argmax equals the class index (or the target row's argmax).
double accuracy(const Tensor& output, const Tensor& target);
// Number of such rows, for callers that reduce counts across ranks.
int64_t countCorrect(const Tensor& output, const Tensor& target);

// Throws unless `target` is (N,) int64 class indices in [0, classes) or a float32 (N, classes) matrix.
// Returns true for class indices.
bool checkClassTarget(const Tensor& output, const Tensor& target, const std::string& who);
// `target` on the output's device (copied when it is not).
Tensor targetOnDevice(const Tensor& output, const Tensor& target);

}  // namespace cyxwiz::nn
