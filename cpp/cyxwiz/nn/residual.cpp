#include "cyxwiz/nn/residual.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

namespace {

std::shared_ptr<SequentialModel> modelOf(const std::vector<std::shared_ptr<Module>>& layers) {
  if (layers.empty()) return nullptr;
  auto model = std::make_shared<SequentialModel>();
  for (const auto& m : layers) model->add(m);
  return model;
}

template <typename T>
void appendNamed(std::vector<std::pair<std::string, T*>>& out, const std::string& prefix,
                 const std::vector<std::pair<std::string, T*>>& named) {
  for (const auto& [name, item] : named) out.emplace_back(prefix + name, item);
}

// a + b on their device (a GPU when either is there: the body's result beside a host input).
Tensor sum(const Tensor& a, const Tensor& b) {
  if (!a.isCuda() && !b.isCuda()) return zipElements(a, b, [](float x, float y) { return x + y; });
  const Device device = a.isCuda() ? a.device() : b.device();
  const Tensor x = a.to(device), y = b.to(device);
  Tensor out = Tensor::empty(a.shape(), DType::Float32, device);
  CYX_CUDA(add(device.index, x.deviceData<float>(), y.deviceData<float>(), out.deviceData<float>(), out.numel()));
  return out;
}

}  // namespace

ResidualModule::ResidualModule(std::shared_ptr<SequentialModel> body, std::shared_ptr<SequentialModel> shortcut)
    : body_(std::move(body)), shortcut_(std::move(shortcut)) {
  CYX_CHECK(body_ && body_->size() > 0, "ResidualModule(body): the body needs at least one layer");
  CYX_CHECK(body_ != shortcut_, "ResidualModule(body, shortcut): the shortcut must be another model than the body");
  if (shortcut_ && shortcut_->size() == 0) shortcut_ = nullptr;
  CYX_CHECK(body_->device() == Device{} && (!shortcut_ || shortcut_->device() == Device{}),
            "ResidualModule: build it from layers on the CPU");
  outputShape({});  // body and shortcut must agree where their shapes are known
}

std::shared_ptr<ResidualModule> ResidualModule::fromLayers(const std::vector<std::shared_ptr<Module>>& body,
                                                           const std::vector<std::shared_ptr<Module>>& shortcut, bool) {
  return std::make_shared<ResidualModule>(modelOf(body), modelOf(shortcut));
}

Shape ResidualModule::outputShape(const Shape& input) const {
  Shape main = body_->outputShape(input);
  const Shape side = shortcut_ ? shortcut_->outputShape(input) : input;
  if (side.empty()) return main;
  bool agree = main.empty() || main.size() == side.size();
  for (size_t i = 0; agree && i < main.size(); ++i) {
    if (main[i] < 0) main[i] = side[i];
    agree = side[i] < 0 || main[i] == side[i];
  }
  if (main.empty()) main = side;
  if (!agree) {
    throw InvalidArgument(makeString("ResidualModule: for input ", describeShape(input), " the body gives ",
                                     describeShape(body_->outputShape(input)), " but the ",
                                     shortcut_ ? "shortcut gives " : "identity shortcut gives ", describeShape(side),
                                     "; give a shortcut (a 1x1 Conv2DModule, say) that maps the input to the body's shape"));
  }
  return main;
}

Tensor ResidualModule::forward(const Tensor& input) {
  CYX_CHECK(input.dtype() == DType::Float32, repr(), ".forward: expected a float32 input, got ", dtypeName(input.dtype()));
  const Shape expected = outputShape(input.shape());
  const Tensor main = body_->forward(input);
  const Tensor side = shortcut_ ? shortcut_->forward(input) : input;
  CYX_CHECK(main.shape() == side.shape() && main.shape() == expected, repr(), ": the body gave ", shapeString(main.shape()),
            " and the shortcut ", shapeString(side.shape()));
  Tensor out = sum(main, side);
  outShape_ = out.shape();
  return out;
}

Tensor ResidualModule::backward(const Tensor& gradOutput) {
  if (outShape_.empty()) throw InvalidArgument(repr() + ".backward called before forward; run forward on the batch first");
  if (gradOutput.dtype() != DType::Float32 || gradOutput.shape() != outShape_) {
    throw InvalidArgument(makeString(typeName(), ".backward: expected a float32 gradient of shape ", shapeString(outShape_),
                                     ", got ", dtypeName(gradOutput.dtype()), " ", shapeString(gradOutput.shape())));
  }
  const Tensor main = body_->backward(gradOutput, needInputGrad_);
  const Tensor side = shortcut_ ? shortcut_->backward(gradOutput, needInputGrad_) : gradOutput;
  gradsReady();
  if (!needInputGrad_) return Tensor();
  return sum(main, side);
}

bool ResidualModule::runsOnGpu() const {
  for (const auto& layer : body_->modules()) {
    if (!layer->runsOnGpu()) return false;
  }
  if (shortcut_) {
    for (const auto& layer : shortcut_->modules()) {
      if (!layer->runsOnGpu()) return false;
    }
  }
  return true;
}

std::vector<Parameter*> ResidualModule::parameters() {
  std::vector<Parameter*> out = body_->parameters();
  if (shortcut_) {
    for (Parameter* p : shortcut_->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<std::pair<std::string, Parameter*>> ResidualModule::namedParameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  appendNamed(out, "body.", body_->namedParameters());
  if (shortcut_) appendNamed(out, "shortcut.", shortcut_->namedParameters());
  return out;
}

std::vector<Buffer*> ResidualModule::buffers() {
  std::vector<Buffer*> out = body_->buffers();
  if (shortcut_) {
    for (Buffer* b : shortcut_->buffers()) out.push_back(b);
  }
  return out;
}

std::vector<std::pair<std::string, Buffer*>> ResidualModule::namedBuffers() {
  std::vector<std::pair<std::string, Buffer*>> out;
  appendNamed(out, "body.", body_->namedBuffers());
  if (shortcut_) appendNamed(out, "shortcut.", shortcut_->namedBuffers());
  return out;
}

ModuleSpec ResidualModule::spec() const {
  return {typeName(), {{"body_layers", double(body_->size())}, {"shortcut_layers", double(shortcut_ ? shortcut_->size() : 0)}}};
}

std::vector<std::shared_ptr<Module>> ResidualModule::children() const {
  std::vector<std::shared_ptr<Module>> out = body_->modules();
  if (shortcut_) out.insert(out.end(), shortcut_->modules().begin(), shortcut_->modules().end());
  return out;
}

std::string ResidualModule::repr() const {
  auto join = [](const SequentialModel& m) {
    std::string s;
    for (const auto& layer : m.modules()) s += (s.empty() ? "" : ", ") + layer->repr();
    return s;
  };
  return makeString("ResidualModule(body=[", join(*body_), "]", shortcut_ ? ", shortcut=[" + join(*shortcut_) + "]" : "", ")");
}

void ResidualModule::to(const Device& device) {
  body_->to(device);
  if (shortcut_) shortcut_->to(device);
  clearCache();
}

void ResidualModule::setTraining(bool training) {
  Module::setTraining(training);
  training ? body_->train() : body_->eval();
  if (shortcut_) training ? shortcut_->train() : shortcut_->eval();
}

void ResidualModule::clearCache() {
  body_->releaseCaches();
  if (shortcut_) shortcut_->releaseCaches();
  outShape_.clear();
}

}  // namespace cyxwiz::nn
