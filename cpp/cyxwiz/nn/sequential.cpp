#include "cyxwiz/nn/sequential.h"

#include <cstdio>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/model_file.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/tensor/host_cache.h"

namespace cyxwiz::nn {

void SequentialModel::add(std::shared_ptr<Module> module) {
  CYX_CHECK(module != nullptr, "SequentialModel.add: module is None");
  for (const auto& m : modules_) {
    CYX_CHECK(m != module, "SequentialModel.add: this ", module->repr(),
              " is already in the model; create a new module for each layer (layers do not share weights)");
  }
  // Fail at build time, not at the first batch, when two layers do not fit together.
  module->outputShape(outputShape({}));
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
  // The last step's saved activations go before this step's are made (layer by layer they would only be
  // replaced as the new ones arrive: the top layers' old ones would stay through most of the forward).
  segments_.clear();
  for (const auto& m : modules_) m->releaseCache();
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
  if (device.type == DeviceType::CUDA) {
    for (size_t i = 0; i < modules_.size(); ++i) {
      CYX_CHECK(modules_[i]->runsOnGpu(), "SequentialModel.to(\"", device.str(), "\"): layer ", i, " (",
                modules_[i]->repr(), ") has CPU kernels only so far; keep this model on the CPU");
    }
  }
  CYX_CHECK(!gradientGuard_, "SequentialModel.to(\"", device.str(), "\"): this model is wrapped in DistributedDataParallel, whose "
            "gradient buckets live on ", device_.str(), "; move the model before wrapping it");
  segments_.clear();  // their inputs live on the device the model is leaving
  const host_cache::ReleaseDirectly moving;  // the host blocks the layers leave are not the next step's
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

std::vector<std::pair<std::string, Parameter*>> SequentialModel::namedParameters() const {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (size_t i = 0; i < modules_.size(); ++i) {
    for (auto& [name, p] : modules_[i]->namedParameters()) out.emplace_back(makeString(i, ".", name), p);
  }
  return out;
}

std::vector<std::pair<std::string, Buffer*>> SequentialModel::namedBuffers() const {
  std::vector<std::pair<std::string, Buffer*>> out;
  for (size_t i = 0; i < modules_.size(); ++i) {
    for (auto& [name, b] : modules_[i]->namedBuffers()) out.emplace_back(makeString(i, ".", name), b);
  }
  return out;
}

std::vector<Buffer*> SequentialModel::buffers() const {
  std::vector<Buffer*> out;
  for (const auto& m : modules_) {
    for (Buffer* b : m->buffers()) out.push_back(b);
  }
  return out;
}

Shape SequentialModel::outputShape(const Shape& input) const {
  Shape shape = input;
  for (size_t i = 0; i < modules_.size(); ++i) {
    try {
      shape = modules_[i]->outputShape(shape);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(makeString("layer ", i, ": ", e.what()));
    }
  }
  return shape;
}

std::string SequentialModel::summary(const Shape& input) const {
  char line[200];
  std::string out;
  std::snprintf(line, sizeof line, "%-4s %-60s %-20s %10s\n", "#", "layer", "output shape", "params");
  out += line;
  out += std::string(97, '-') + "\n";
  Shape shape = input;
  for (size_t i = 0; i < modules_.size(); ++i) {
    shape = modules_[i]->outputShape(shape);
    std::snprintf(line, sizeof line, "%-4zu %-60s %-20s %10lld\n", i, modules_[i]->repr().c_str(),
                  describeShape(shape).c_str(), static_cast<long long>(modules_[i]->numParameters()));
    out += line;
  }
  out += std::string(97, '-') + "\n";
  out += makeString("total parameters: ", numParameters(), " (", numParameters() * 4, " bytes as float32)\n");
  return out;
}

namespace {

void appendFingerprint(std::string& out, const Module& m) {
  ModuleSpec s = m.spec();
  out += s.type + "{";
  for (const auto& [key, value] : s.attrs) out += makeString(key, "=", value, ";");
  for (const auto& child : m.children()) appendFingerprint(out, *child);
  out += "}";
}

}  // namespace

std::string SequentialModel::architectureFingerprint() const {
  std::string out;
  for (const auto& m : modules_) appendFingerprint(out, *m);
  return out;
}

void SequentialModel::save(const std::string& path) const { writeModelFile(path, *this); }

std::shared_ptr<SequentialModel> SequentialModel::load(const std::string& path) { return readModelFile(path); }

}  // namespace cyxwiz::nn
