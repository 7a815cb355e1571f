// SequentialModel: modules applied in order; backward runs them in reverse.
#pragma once

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cyxwiz/nn/autocast.h"
#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class SequentialModel {
 public:
  void add(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  // Whether its input is token ids (its first layer is an EmbeddingModule).
  bool takesIndices() const { return !modules_.empty() && modules_[0]->takesIndices(); }
  const std::shared_ptr<Module>& at(size_t i) const;
  const std::vector<std::shared_ptr<Module>>& modules() const { return modules_; }

  Tensor forward(const Tensor& input);
  // Accumulates parameter gradients; returns the gradient w.r.t. the model input when
  // `needInputGrad` (else an undefined Tensor, and the first layer skips that GEMM).
  Tensor backward(const Tensor& gradOutput, bool needInputGrad = false);
  void zeroGrad();
  void releaseCaches();  // every layer's Module::releaseCache, and the checkpointed segments' inputs

  // Gradient checkpointing, with the meaning torch.utils.checkpoint.checkpoint_sequential gives
  // `segments`: k >= 2 splits the layers into k contiguous segments of near-equal size. A forward in
  // training mode then keeps only each segment's input (and the random stream's state there) and
  // drops the layers' caches of every segment but the last; backward re-runs each earlier segment's
  // forward from its input just before that segment's backward. Activation memory falls to the
  // segments' inputs plus one segment's caches, for one more forward of the earlier segments.
  // The result is bit-identical to training without it (Dropout redraws the very masks, and the
  // random stream ends where a plain step leaves it). 0 (the default) turns it off; 1 is one segment,
  // kept whole: no recomputation, as torch's segments=1. A LinearModule and the ReLUModule after it run
  // as one fused call and stay in one segment, so at most that many segments form; a larger k acts as
  // that number. A runtime setting, like train()/eval(): not architecture, not saved in model files.
  void setGradientCheckpointing(int segments);
  int gradientCheckpointing() const { return checkpointSegments_; }

  // Moves every parameter to `device` (checked: a GPU build with a visible GPU). Inputs and gradients
  // handed to forward/backward are copied to this device at the edge.
  void to(const Device& device);
  Device device() const { return device_; }

  // Layer by layer, weight then bias. Pointers stay valid while the model lives.
  std::vector<Parameter*> parameters() const;
  int64_t numParameters() const;
  void train() { setTraining(true); }
  void eval() { setTraining(false); }
  bool training() const { return training_; }

  std::string repr() const;
  // Named as in model files and torch's state_dict: "3.weight", "5.body.0.running_mean".
  std::vector<std::pair<std::string, Parameter*>> namedParameters() const;
  std::vector<std::pair<std::string, Buffer*>> namedBuffers() const;
  std::vector<Buffer*> buffers() const;
  // The output shape for an input of `input` (batch first; -1 unknown), through every layer; throws
  // InvalidArgument naming the layer that does not take what the one before it gives.
  Shape outputShape(const Shape& input) const;
  // A table: index, layer, output shape, parameter count, for an input of `input` (one sample's shape
  // with the batch first, -1 where unknown); empty infers what the first layer states.
  std::string summary(const Shape& input = {}) const;
  // A string that changes when the architecture (types, attributes, parameter shapes) does.
  std::string architectureFingerprint() const;

  // Called before the gradients are used from outside: read (gradients()), cleared (zero_grad) or
  // stepped on (optimizer.step). DistributedDataParallel installs one that waits for its in-flight
  // all-reduces and refuses a step on gradients not yet averaged across ranks.
  enum class GradientUse { Read, Clear, Step };
  using GradientGuard = std::function<void(GradientUse)>;
  void setGradientGuard(GradientGuard guard) { gradientGuard_ = std::move(guard); }
  void guardGradients(GradientUse use) const {
    if (gradientGuard_) gradientGuard_(use);
  }

  void save(const std::string& path) const;
  static std::shared_ptr<SequentialModel> load(const std::string& path);

 private:
  void setTraining(bool training);

  // A LinearModule at `i` runs fused with the ReLUModule after it (one call; one cuBLASLt matmul with
  // a ReLU epilogue on a GPU). Not when the ReLU is the last layer: its output goes to the caller,
  // who may write to it, and a module never keeps what the caller can change.
  bool fusedAt(size_t i) const;
  // Layers [begin, end) on x; a segment never ends between a fused pair.
  Tensor runLayers(size_t begin, size_t end, Tensor x);

  // Gradient checkpointing (gradient_checkpointing.cpp).
  struct Segment {
    size_t begin = 0, end = 0;  // layers [begin, end)
    Tensor input;               // engine-owned: never the caller's array
    std::mt19937_64 random;     // the global generator as this segment's forward found it
    AutocastState autocast;     // mixed precision (nn/autocast.h) as its forward ran: so runs its replay
    bool cached = false;        // its layers hold their caches (the last segment after forward)
  };
  std::vector<std::pair<size_t, size_t>> segmentBounds() const;
  Tensor forwardCheckpointed(const Tensor& input);
  Tensor backwardCheckpointed(const Tensor& gradOutput, bool needInputGrad);
  void recompute(Segment& segment, const Tensor* nextInput);

  std::vector<std::shared_ptr<Module>> modules_;
  int checkpointSegments_ = 0;
  std::vector<Segment> segments_;  // of the last forward when it was checkpointed; empty otherwise
  bool training_ = true;
  Device device_;
  GradientGuard gradientGuard_;
};

}  // namespace cyxwiz::nn
