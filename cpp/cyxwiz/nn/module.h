// Module: one layer of a SequentialModel. Each subclass keeps forward and backward side by side.
//
// Contract: forward(x) caches what backward needs, and only its input, through keepForBackward: a
// buffer the caller can write to (their numpy array, or the output we hand back) is never what
// backward reads, so changing an array between forward and backward cannot corrupt gradients; backward(gradOutput) ADDS the parameter gradients
// into each Parameter::grad (so gradient accumulation is just not zeroing) and returns the gradient
// w.r.t. the input, or an undefined Tensor when needInputGrad is false (the first layer of a model:
// nothing consumes it, and skipping it saves a GEMM).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

struct Parameter {
  std::string name;  // "weight", "bias"
  Tensor value;
  Tensor grad;       // same shape; may be rebound to a view into a DDP bucket
};

// What a module is, in a form a model file can store: type name plus numeric attributes.
struct ModuleSpec {
  std::string type;
  std::map<std::string, double> attrs;
};

class Module {
 public:
  virtual ~Module() = default;

  virtual std::string typeName() const = 0;
  virtual Tensor forward(const Tensor& input) = 0;
  virtual Tensor backward(const Tensor& gradOutput) = 0;

  virtual std::vector<Parameter*> parameters() { return {}; }
  virtual ModuleSpec spec() const { return {typeName(), {}}; }
  virtual std::string repr() const { return typeName() + "()"; }
  // Output feature count for an input with `inFeatures` columns (shape-preserving by default).
  virtual int64_t outFeatures(int64_t inFeatures) const { return inFeatures; }

  void zeroGrad();
  int64_t numParameters();
  // Moves parameters and gradients to `device` (SequentialModel::to checks that it is usable).
  void to(const Device& device);
  // Drops what forward kept for backward (a captured graph step frees its temporaries inside the
  // capture); backward then needs a new forward.
  void releaseCache() { clearCache(); }
  // What forward kept for backward, for inspection (dtype and bytes: autocast keeps 16-bit copies).
  // LinearModule and ReLUModule report theirs; other layers report nothing.
  virtual std::vector<Tensor> savedTensors() const { return {}; }
  void setTraining(bool training) { training_ = training; }
  bool training() const { return training_; }
  void setNeedInputGrad(bool need) { needInputGrad_ = need; }
  bool needInputGrad() const { return needInputGrad_; }
  // Called by backward once this module's parameter gradients are complete and before the input
  // gradient is computed: DDP starts their all-reduce there, overlapping it with the rest of backward.
  using GradReadyHook = std::function<void(Module&)>;
  void setGradReadyHook(GradReadyHook hook) { gradReadyHook_ = std::move(hook); }

 protected:
  // The input as backward may keep it: engine-owned buffers as they are, borrowed ones copied.
  static Tensor keepForBackward(const Tensor& input) { return input.borrowed() ? input.clone() : input; }
  // Throws unless forward has run (`cached` is defined).
  void requireForward(const Tensor& cached) const;
  // requireForward, then: `gradOutput` is float32 of the `expected` shape (what forward returned).
  void checkBackward(const Tensor& cached, const Tensor& gradOutput, const Shape& expected) const;

  // Drops what forward cached for backward (it may live on the device the module is leaving).
  virtual void clearCache() {}

  void gradsReady() {
    if (gradReadyHook_) gradReadyHook_(*this);
  }

  bool training_ = true;
  bool needInputGrad_ = true;

 private:
  GradReadyHook gradReadyHook_;
};

// Builds a module from its stored spec (model files). Throws InvalidArgument for an unknown type or
// bad attributes.
std::shared_ptr<Module> makeModule(const ModuleSpec& spec);

// The parameters (name, dtype, shape) that makeModule(spec) would allocate, computed without
// allocating them, so that a model file's layers can be matched against the tensors it really stores
// before anything is built. Throws like makeModule.
struct ParameterShape {
  std::string name;
  DType dtype;
  Shape shape;
};
std::vector<ParameterShape> parameterShapes(const ModuleSpec& spec);

// Requires a 2-D float32 (batch, features) tensor; `who` names the caller in the message.
void requireMatrix(const Tensor& t, const std::string& who, int64_t features = -1);

}  // namespace cyxwiz::nn
