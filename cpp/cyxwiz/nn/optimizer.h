// Optimizer: step(model) updates every parameter from its accumulated gradient.
//
// Per-parameter state (momentum, Adam moments) is allocated on the first step, in parameters()
// order, and can be read out and restored as named tensors plus scalars (checkpoints).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class SequentialModel;

struct OptimizerState {
  std::map<std::string, double> scalars;  // "step", "lr", hyper-parameters
  std::map<std::string, Tensor> tensors;  // "<slot>.<parameter index>", e.g. "exp_avg.3"
};

class Optimizer {
 public:
  explicit Optimizer(double learningRate);
  virtual ~Optimizer() = default;
  virtual std::string typeName() const = 0;
  virtual std::string repr() const = 0;

  void step(SequentialModel& model);
  // step() in two halves, so DDP can update a bucket's parameters as soon as its all-reduce lands:
  // beginStep once per step, then updateParameter once for every index of `params`.
  void beginStep(const std::vector<Parameter*>& params);
  void updateParameter(size_t index, Parameter& param);
  void zeroGrad(SequentialModel& model);
  double learningRate() const { return lr_; }
  void setLearningRate(double lr);
  int64_t stepCount() const { return steps_; }

  OptimizerState state() const;
  void loadState(const OptimizerState& state);

 protected:
  // Names of the per-parameter buffers this optimizer keeps (zero-initialised, parameter-shaped).
  virtual std::vector<std::string> slotNames() const = 0;
  // Updates one parameter; `slots` holds the buffers named by slotNames(). steps_ is already incremented.
  virtual void update(Parameter& param, std::vector<Tensor>& slots) = 0;
  virtual void hyperParameters(std::map<std::string, double>& out) const = 0;

  double lr_;
  int64_t steps_ = 0;

 private:
  void ensureState(const std::vector<Parameter*>& params);
  std::vector<std::vector<Tensor>> slots_;  // [parameter][slot]
};

void checkHyperParameter(bool ok, const std::string& who, const std::string& name, double value, const std::string& rule);

}  // namespace cyxwiz::nn
