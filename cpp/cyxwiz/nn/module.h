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
#include <utility>
#include <vector>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

struct Parameter {
  std::string name;  // "weight", "bias"
  Tensor value;
  Tensor grad;       // same shape; may be rebound to a view into a DDP bucket
};

// State that is not learned (BatchNorm's running statistics): saved in model files and checkpoints,
// moved with the model, broadcast by DDP (DDPConfig::broadcastBuffers), never stepped or averaged.
struct Buffer {
  std::string name;  // "running_mean", "running_var", "num_batches_tracked"
  Tensor value;
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
  // Parameters under the names model files and named_parameters() use ("weight", or "body.0.weight"
  // in a module that holds others), in parameters() order.
  virtual std::vector<std::pair<std::string, Parameter*>> namedParameters();
  virtual std::vector<Buffer*> buffers() { return {}; }
  virtual std::vector<std::pair<std::string, Buffer*>> namedBuffers();
  virtual ModuleSpec spec() const { return {typeName(), {}}; }
  // Modules held inside this one (ResidualModule's body and shortcut), stored after its spec in model files.
  virtual std::vector<std::shared_ptr<Module>> children() const { return {}; }
  // The modules this one runs inside its own forward that children() does not list (a Transformer
  // block's sublayers, attention's GPU weight dropout), in the order their forward runs: for whoever
  // must reach every layer (the graphed step's dropout seeds). Not stored in model files.
  virtual std::vector<Module*> innerModules() { return {}; }
  virtual std::string repr() const { return typeName() + "()"; }
  // The output shape for an input of shape `input` (batch first), or throws InvalidArgument saying what
  // this module expects. -1 is a size not known yet (the batch, an image's height before the first
  // batch); an empty shape is an input nothing is known about. Shape-preserving by default.
  virtual Shape outputShape(const Shape& input) const { return input; }
  // False for layers with CPU kernels only: SequentialModel.to("cuda") then says which layer cannot move.
  virtual bool runsOnGpu() const { return true; }
  // True for a layer whose input is token ids (EmbeddingModule): the bindings then pass integer arrays
  // as int64 instead of converting them to float32.
  virtual bool takesIndices() const { return false; }
  // Key/value-cached generation (nn/generate.cpp): decode(x, position) is forward of the tokens at
  // positions [position, position + T) of sequences whose earlier tokens went through decode() since
  // resetDecoding(). canDecode(): the layers that act on each position alone (their forward serves),
  // the positional encoding (the offset) and causal attention (the keys and values it keeps); CPU only.
  virtual bool canDecode() const { return false; }
  virtual Tensor decode(const Tensor& input, int64_t position) {
    (void)position;
    return forward(input);
  }
  virtual void resetDecoding() {}

  void zeroGrad();
  int64_t numParameters();
  // Moves parameters, gradients and buffers to `device` (SequentialModel::to checks that it is usable).
  virtual void to(const Device& device);
  // Drops what forward kept for backward (a captured graph step frees its temporaries inside the
  // capture); backward then needs a new forward.
  void releaseCache() { clearCache(); }
  // What forward kept for backward, for inspection (dtype and bytes: autocast keeps 16-bit copies).
  // LinearModule and ReLUModule report theirs; other layers report nothing.
  virtual std::vector<Tensor> savedTensors() const { return {}; }
  virtual void setTraining(bool training) { training_ = training; }
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

// Builds a module from its stored spec and, for a module that holds others (children()), those
// modules built first (model files). Throws InvalidArgument for an unknown type or bad attributes.
std::shared_ptr<Module> makeModule(const ModuleSpec& spec, std::vector<std::shared_ptr<Module>> children = {});
// How many child modules a model file stores after `spec` (its children(), depth first).
size_t childCount(const ModuleSpec& spec);

// The parameters, then the buffers (name, dtype, shape) that makeModule(spec) would allocate itself
// (its children's are theirs), computed without
// allocating them, so that a model file's layers can be matched against the tensors it really stores
// before anything is built. Throws like makeModule.
struct ParameterShape {
  std::string name;
  DType dtype;
  Shape shape;
  bool buffer = false;  // a Buffer (running statistics), not a Parameter
};
std::vector<ParameterShape> parameterShapes(const ModuleSpec& spec);

// Requires a 2-D float32 (batch, features) tensor; `who` names the caller in the message.
void requireMatrix(const Tensor& t, const std::string& who, int64_t features = -1);

// Requires a float32 tensor of `rank` dimensions (on any device); `who` names the module
// ("Conv2DModule(1, 8, ...)") and `layout` the dimensions ("(N, C, H, W)").
void requireInput(const Tensor& t, const std::string& who, int64_t rank, const char* layout);

// "(4, 3, 8, 8)" with unknown sizes as "N" (the first) or "?".
std::string describeShape(const Shape& shape);

}  // namespace cyxwiz::nn
