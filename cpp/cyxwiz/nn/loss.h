// Loss: forward(output, target) -> batch mean; backward(output, target) -> d(mean)/d(output).
//
// Targets are either class indices (int64, shape (N,), or (N, T) for an (N, T, classes) output: one per
// position of a sequence) or rows of the output's shape (one-hot or probabilities for CrossEntropyLoss,
// regression targets for MSELoss), float32. The mean is over terms(): rows, or every position.
//
// forward/backward check the target and copy it to the output's device on every call, and forward
// reads its result back to the host. A training loop that wants neither (DistributedTrainer) checks
// and moves each batch's target once with prepareTarget, then calls addLossSum and gradient, which
// leave everything where the output lives: a GPU step then needs no host read at all.
#pragma once

#include <optional>
#include <string>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

// A class index that marks a position to leave out (torch's ignore_index), or none.
using IgnoreIndex = std::optional<int64_t>;

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string typeName() const = 0;
  // True when a 1-D target means class indices (CrossEntropyLoss), false when targets are values
  // of the output's shape (MSELoss): the bindings convert targets accordingly.
  virtual bool takesClassIndices() const = 0;
  // The class index whose positions count neither in the mean nor in accuracy (CrossEntropyLoss's).
  virtual IgnoreIndex ignoreIndex() const { return std::nullopt; }

  double forward(const Tensor& output, const Tensor& target);
  // How many terms the mean of an output of this shape averages: its rows (N), or for a loss over
  // sequences every position (N * T of an (N, T, classes) output), less those a class-index target
  // marks as ignored (CrossEntropyLoss's ignore_index). `target` as checkTarget accepts it.
  virtual int64_t terms(const Shape& outputShape, const Tensor& target) const {
    (void)target;
    return outputShape.at(0);
  }
  Tensor backward(const Tensor& output, const Tensor& target);

  // Throws (naming `who`) unless `target` fits a float32 output of `outputShape`.
  virtual void checkTarget(const Shape& outputShape, const Tensor& target, const std::string& who) const = 0;
  // checkTarget for `output` (a float32 tensor), then `target` on the output's device.
  Tensor prepareTarget(const Tensor& output, const Tensor& target, const std::string& who) const;
  // sums[index] += the batch's loss summed over its terms (terms * mean), with `sums` a float64 tensor
  // on the output's device and `target` from prepareTarget. No host read.
  virtual void addLossSum(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index) const = 0;
  // d(mean)/d(output), `target` from prepareTarget.
  virtual Tensor gradient(const Tensor& output, const Tensor& target) const = 0;
};

// Fraction of rows (every position of a sequence output) whose argmax equals the class index (or the
// target row's argmax); positions whose index is `ignore` count neither way.
double accuracy(const Tensor& output, const Tensor& target, IgnoreIndex ignore = std::nullopt);
// Number of such rows, for callers that reduce counts across ranks.
int64_t countCorrect(const Tensor& output, const Tensor& target, IgnoreIndex ignore = std::nullopt);
// sums[index] += that number, `target` checked by checkClassTarget and on the output's device.
void addCorrectCount(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index,
                     IgnoreIndex ignore = std::nullopt);
// How many class indices of `target` (int64, any device) are not `ignore`; every row of a float32 target.
int64_t countTargets(const Tensor& target, IgnoreIndex ignore);

// Throws unless `target` is int64 class indices in [0, classes) (or equal to `ignore`) of the output's
// shape without its last dimension ((N,) for (N, classes), (N, T) for (N, T, classes)) or float32 rows of
// the output's shape. Returns true for class indices. Labels on a GPU are copied to the host for the
// range check.
bool checkClassTarget(const Shape& outputShape, const Tensor& target, const std::string& who,
                      IgnoreIndex ignore = std::nullopt);
// `target` on the output's device (copied when it is not).
Tensor targetOnDevice(const Tensor& output, const Tensor& target);

}  // namespace cyxwiz::nn
