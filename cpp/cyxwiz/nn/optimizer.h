// Optimizer: step(model) updates every parameter from its accumulated gradient.
//
// Per-parameter state (momentum, Adam moments) is allocated on the first step, in parameters()
// order, and can be read out and restored as named tensors plus scalars (checkpoints).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cyxwiz/cuda/api.h"
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
  // beginStep once per step, then updateParameters for groups of indices of `params` that together
  // name each parameter once. A group on a GPU is one fused kernel launch.
  void beginStep(const std::vector<Parameter*>& params);
  void updateParameters(const std::vector<size_t>& indices, const std::vector<Parameter*>& params);
  // Elements [first, last) of parameter i (CPU) from `grad`, their last - first gradients: DDP's fused
  // step hands over each piece of the averaged gradients as it is reduced (ddp.h). Within this rank's
  // shard when sharded; every element of each parameter once per step, after beginStep. The same bits as
  // updateParameters: the updates are element by element.
  void updateRange(size_t i, const std::vector<Parameter*>& params, int64_t first, int64_t last, const float* grad);
  void zeroGrad(SequentialModel& model);
  double learningRate() const { return lr_; }
  void setLearningRate(double lr);
  int64_t stepCount() const { return steps_; }

  OptimizerState state() const;
  void loadState(const OptimizerState& state);

  // A sharded step (DistributedDataParallel with shard_optimizer): this rank updates elements
  // [first, second) of parameter i alone and keeps state for those alone (whole state loaded from a
  // checkpoint is cut down at the next step). Empty: every element, the default.
  void setShard(std::vector<std::pair<int64_t, int64_t>> ranges);
  bool sharded() const { return !shard_.empty(); }
  // The whole state of a sharded optimizer: gather(parts) takes one slot's parts, one per parameter,
  // and returns that slot's whole buffers, put together from every rank (a collective).
  using GatherSlot = std::function<std::vector<Tensor>(const std::vector<Tensor>& parts)>;
  OptimizerState state(const GatherSlot& gather) const;

  // For a step captured into a CUDA graph (ddp/graphed_step.h): the graph replays the kernels with
  // the arguments they were captured with, so the per-step scalars (learning rate, Adam's bias
  // corrections) must come from device memory that is rewritten before every replay.
  // enableGraphScalars(device) allocates that buffer on `device`. While capturing, beginStep does not
  // count the step and the GPU kernels are given the buffer; prepareReplay(params) counts the step and
  // writes its scalars there, before each replay. Eager steps keep passing arguments.
  // disableGraphScalars() drops the buffer.
  void enableGraphScalars(const Device& device);
  void disableGraphScalars();
  void setCapturing(bool capturing) { capturing_ = capturing && graphScalars_.defined(); }
  void prepareReplay(const std::vector<Parameter*>& params);

 protected:
  // Names of the per-parameter buffers this optimizer keeps (zero-initialised, parameter-shaped).
  virtual std::vector<std::string> slotNames() const = 0;
  // Elements of one parameter and its gradient (all of them, this rank's shard, or a piece of either),
  // and the same elements of the buffers named by slotNames() (null past them).
  struct Span {
    float* value;
    const float* grad;
    int64_t n;
    float* slots[2];
  };
  // Updates one span, element by element (so any piece of a parameter updates as the whole would).
  // steps_ is already incremented.
  virtual void update(const Span& span) = 0;
  // The same for parameters on one GPU, all in one call; slots[k] belongs to params[k].
  virtual void updateOnDevice(const Device& device, const std::vector<cuda::OptimizerTensor>& tensors) = 0;
  virtual void hyperParameters(std::map<std::string, double>& out) const = 0;
  // The scalars of step steps_ as the GPU kernel reads them from device memory (api.h: sgdStep,
  // adamStep).
  virtual std::vector<float> stepScalars() const = 0;
  // The device buffer for the kernels while a step is being captured, else null: an eager step passes
  // its scalars as arguments, even between replays.
  const float* graphScalars() const { return capturing_ ? graphScalars_.deviceData<float>() : nullptr; }

  double lr_;
  int64_t steps_ = 0;

 private:
  void ensureState(const std::vector<Parameter*>& params);
  // Parameter i's span of elements [first, last) (absolute: within its shard when sharded).
  Span spanOf(size_t i, Parameter& p, int64_t first, int64_t last, const float* grad);
  OptimizerState scalars() const;
  std::vector<std::vector<Tensor>> slots_;  // [parameter][slot]
  std::vector<std::pair<int64_t, int64_t>> shard_;  // [parameter]: elements this rank updates
  bool slotsSharded_ = false;                        // slots_ hold shards (not whole buffers)
  Tensor graphScalars_;
  bool capturing_ = false;
};

void checkHyperParameter(bool ok, const std::string& who, const std::string& name, double value, const std::string& rule);

}  // namespace cyxwiz::nn
