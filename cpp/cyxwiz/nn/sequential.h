// SequentialModel: modules applied in order; backward runs them in reverse.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class SequentialModel {
 public:
  void add(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& at(size_t i) const;
  const std::vector<std::shared_ptr<Module>>& modules() const { return modules_; }

  Tensor forward(const Tensor& input);
  // Accumulates parameter gradients; returns the gradient w.r.t. the model input when
  // `needInputGrad` (else an undefined Tensor, and the first layer skips that GEMM).
  Tensor backward(const Tensor& gradOutput, bool needInputGrad = false);
  void zeroGrad();
  void releaseCaches();  // every layer's Module::releaseCache

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
  // A table: index, layer, output features, parameter count; `inFeatures` < 0 infers from the first layer.
  std::string summary(int64_t inFeatures = -1) const;
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

  std::vector<std::shared_ptr<Module>> modules_;
  bool training_ = true;
  Device device_;
  GradientGuard gradientGuard_;
};

}  // namespace cyxwiz::nn
