#include "cyxwiz/nn/sequential.h"

#include <cstdio>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/model_file.h"
#include "cyxwiz/nn/relu.h"

namespace cyxwiz::nn {

void SequentialModel::add(std::shared_ptr<Module> module) {
  CYX_CHECK(module != nullptr, "SequentialModel.add: module is None");
  for (const auto& m : modules_) {
    CYX_CHECK(m != module, "SequentialModel.add: this ", module->repr(),
              " is already in the model; create a new module for each layer (layers do not share weights)");
  }
  // Fail at build time, not at the first batch, when two linear layers do not fit together.
  int64_t features = -1;
  for (const auto& m : modules_) features = m->outFeatures(features);
  if (features >= 0) module->outFeatures(features);
  module->setTraining(training_);
  module->to(device_);
  segments_.clear();  // a new layer changes where segments end
  modules_.push_back(std::move(module));
}

const std::shared_ptr<Module>& SequentialModel::at(size_t i) const {
  if (i >= modules_.size()) {
    throw InvalidArgument(makeString("layer index ", i, " out of range for a model of ", modules_.size(), " layers"));
  }
  return modules_[i];
}

Tensor SequentialModel::forward(const Tensor& input) {
  CYX_CHECK(!modules_.empty(), "SequentialModel.forward: the model has no layers; add some with model.add(...)");
  segments_.clear();  // the last step's segment inputs go before this step's are made
  if (training_ && checkpointSegments_ > 1) return forwardCheckpointed(input);
  return runLayers(0, modules_.size(), input.to(device_));
}

bool SequentialModel::fusedAt(size_t i) const {
  return i + 2 < modules_.size() && dynamic_cast<LinearModule*>(modules_[i].get()) &&
         dynamic_cast<ReLUModule*>(modules_[i + 1].get());
}

Tensor SequentialModel::runLayers(size_t begin, size_t end, Tensor x) {
  for (size_t i = begin; i < end; ++i) {
    if (fusedAt(i)) {
      auto* linear = static_cast<LinearModule*>(modules_[i].get());
      x = linear->forward(x, true);
      static_cast<ReLUModule*>(modules_[i + 1].get())->keepOutputAsInput(x);
      ++i;
      continue;
    }
    x = modules_[i]->forward(x);
  }
  return x;
}

Tensor SequentialModel::backward(const Tensor& gradOutput, bool needInputGrad) {
  CYX_CHECK(!modules_.empty(), "SequentialModel.backward: the model has no layers");
  if (!segments_.empty()) return backwardCheckpointed(gradOutput, needInputGrad);
  Tensor g = gradOutput.to(device_);
  for (size_t i = modules_.size(); i-- > 0;) {
    // Every layer but the first must hand a gradient down; the first only when the caller wants it.
    modules_[i]->setNeedInputGrad(i > 0 || needInputGrad);
    g = modules_[i]->backward(g);
  }
  return g;
}

void SequentialModel::releaseCaches() {
  segments_.clear();
  for (const auto& m : modules_) m->releaseCache();
}

void SequentialModel::zeroGrad() {
  guardGradients(GradientUse::Clear);
  for (const auto& m : modules_) m->zeroGrad();
}

void SequentialModel::to(const Device& device) {
  if (device == device_) return;
  device::requireDevice(device, "SequentialModel.to");
  CYX_CHECK(!gradientGuard_, "SequentialModel.to(\"", device.str(), "\"): this model is wrapped in DistributedDataParallel, whose "
            "gradient buckets live on ", device_.str(), "; move the model before wrapping it");
  segments_.clear();  // their inputs live on the device the model is leaving
  for (const auto& m : modules_) m->to(device);
  device_ = device;
}

std::vector<Parameter*> SequentialModel::parameters() const {
  std::vector<Parameter*> out;
  for (const auto& m : modules_) {
    for (Parameter* p : m->parameters()) out.push_back(p);
  }
  return out;
}

int64_t SequentialModel::numParameters() const {
  int64_t n = 0;
  for (const auto& m : modules_) n += m->numParameters();
  return n;
}

void SequentialModel::setTraining(bool training) {
  training_ = training;
  for (const auto& m : modules_) m->setTraining(training);
}

std::string SequentialModel::repr() const {
  std::string out = "SequentialModel(\n";
  for (size_t i = 0; i < modules_.size(); ++i) out += makeString("  (", i, "): ", modules_[i]->repr(), "\n");
  return out + ")";
}

std::string SequentialModel::summary(int64_t inFeatures) const {
  if (inFeatures < 0 && !modules_.empty()) {
    if (auto* first = dynamic_cast<LinearModule*>(modules_.front().get())) inFeatures = first->inFeatures();
  }
  char line[160];
  std::string out;
  std::snprintf(line, sizeof line, "%-4s %-60s %10s %10s\n", "#", "layer", "out", "params");
  out += line;
  out += std::string(87, '-') + "\n";
  int64_t features = inFeatures;
  for (size_t i = 0; i < modules_.size(); ++i) {
    features = modules_[i]->outFeatures(features);
    std::string shape = features >= 0 ? makeString("(N, ", features, ")") : "?";
    std::snprintf(line, sizeof line, "%-4zu %-60s %10s %10lld\n", i, modules_[i]->repr().c_str(), shape.c_str(),
                  static_cast<long long>(modules_[i]->numParameters()));
    out += line;
  }
  out += std::string(87, '-') + "\n";
  out += makeString("total parameters: ", numParameters(), " (", numParameters() * 4, " bytes as float32)\n");
  return out;
}

std::string SequentialModel::architectureFingerprint() const {
  std::string out;
  for (const auto& m : modules_) {
    ModuleSpec s = m->spec();
    out += s.type + "{";
    for (const auto& [key, value] : s.attrs) out += makeString(key, "=", value, ";");
    out += "}";
  }
  return out;
}

void SequentialModel::save(const std::string& path) const { writeModelFile(path, *this); }

std::shared_ptr<SequentialModel> SequentialModel::load(const std::string& path) { return readModelFile(path); }

}  // namespace cyxwiz::nn
