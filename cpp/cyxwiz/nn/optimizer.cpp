#include "cyxwiz/nn/optimizer.h"

#include <algorithm>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::nn {

void checkHyperParameter(bool ok, const std::string& who, const std::string& name, double value, const std::string& rule) {
  CYX_CHECK(ok, who, ": ", name, "=", value, " is invalid; ", rule);
}

Optimizer::Optimizer(double learningRate) : lr_(learningRate) { setLearningRate(learningRate); }

void Optimizer::setLearningRate(double lr) {
  checkHyperParameter(lr >= 0.0, "optimizer", "learning_rate", lr, "it must be >= 0");
  lr_ = lr;
}

void Optimizer::ensureState(const std::vector<Parameter*>& params) {
  const size_t nslots = slotNames().size();
  CYX_CHECK(shard_.empty() || shard_.size() == params.size(), rankPrefix(), typeName(), ".step: this optimizer is sharded for a model of ",
            shard_.size(), " parameters but was given ", params.size(), "; use one optimizer per model");
  // A buffer's shape: the parameter's, or its shard's length.
  auto shapeOf = [&](size_t i) -> Shape {
    if (shard_.empty()) return params[i]->value.shape();
    return {shard_[i].second - shard_[i].first};
  };
  if (slots_.empty() && nslots > 0) {
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<Tensor> buffers;
      for (size_t s = 0; s < nslots; ++s) buffers.push_back(Tensor::zeros(shapeOf(i), DType::Float32, params[i]->value.device()));
      slots_.push_back(std::move(buffers));
    }
    slotsSharded_ = !shard_.empty();
    return;
  }
  bool same = nslots == 0 || slots_.size() == params.size();
  for (size_t i = 0; same && nslots && i < params.size(); ++i) {
    for (Tensor& buffer : slots_[i]) {
      if (!shard_.empty() && buffer.shape() == params[i]->value.shape() && buffer.shape() != shapeOf(i)) {
        // Whole state (a checkpoint, or steps taken before sharding): keep this rank's shard of it.
        buffer = buffer.reshape({buffer.numel()}).view(shard_[i].first, shapeOf(i)).clone();
      }
      same = same && buffer.shape() == shapeOf(i);
    }
  }
  CYX_CHECK(same, typeName(), ".step: this optimizer holds state for a different model (", slots_.size(),
            " parameters); use one optimizer per model");
  slotsSharded_ = !shard_.empty() && !slots_.empty();
  // State restored from a checkpoint, or a model moved with model.to(...): the buffers follow the parameters.
  for (size_t i = 0; nslots && i < params.size(); ++i) {
    for (Tensor& buffer : slots_[i]) buffer = buffer.to(params[i]->value.device());
  }
}

void Optimizer::setShard(std::vector<std::pair<int64_t, int64_t>> ranges) {
  if (ranges == shard_) return;
  CYX_CHECK(!slotsSharded_, rankPrefix(), typeName(), ": this optimizer holds sharded state for another DistributedDataParallel; use "
            "one optimizer per model");
  shard_ = std::move(ranges);
}

void Optimizer::step(SequentialModel& model) {
  CYX_CHECK(shard_.empty(), rankPrefix(), typeName(), ".step(model): this optimizer is sharded across ranks by DistributedDataParallel "
            "(shard_optimizer=True) and updates only this rank's share of each parameter; call "
            "ddp.update_parameters(optimizer), which also shares the updated parameters");
  model.guardGradients(SequentialModel::GradientUse::Step);
  std::vector<Parameter*> params = model.parameters();
  beginStep(params);
  std::vector<size_t> all(params.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  updateParameters(all, params);
}

void Optimizer::beginStep(const std::vector<Parameter*>& params) {
  ensureState(params);
  if (!capturing_) ++steps_;  // a captured step is counted by prepareReplay, once per replay
}

void Optimizer::enableGraphScalars(const Device& device) {
  graphScalars_ = Tensor::zeros({static_cast<int64_t>(stepScalars().size())}, DType::Float32, device);
}

void Optimizer::disableGraphScalars() {
  graphScalars_ = Tensor();
  capturing_ = false;
}

void Optimizer::prepareReplay(const std::vector<Parameter*>& params) {
  CYX_CHECK(graphScalars_.defined(), typeName(), ": prepareReplay without enableGraphScalars");
  ensureState(params);
  ++steps_;
  const std::vector<float> scalars = stepScalars();
  Tensor host = Tensor::empty({static_cast<int64_t>(scalars.size())});
  std::copy(scalars.begin(), scalars.end(), host.data<float>());
  graphScalars_.copyFrom(host);  // stream-ordered: lands before the replay queued after it
}

void Optimizer::updateParameters(const std::vector<size_t>& indices, const std::vector<Parameter*>& params) {
  std::vector<cuda::OptimizerTensor> gpu;
  Device device;
  std::vector<Tensor> none;
  for (size_t i : indices) {
    Parameter& p = *params.at(i);
    std::vector<Tensor>& slots = slots_.empty() ? none : slots_.at(i);
    const int64_t first = shard_.empty() ? 0 : shard_.at(i).first;
    const int64_t n = shard_.empty() ? p.value.numel() : shard_.at(i).second - first;
    if (n == 0) continue;
    if (!p.value.isCuda()) {
      update(spanOf(i, p, first, first + n, p.grad.data<float>() + first));
      continue;
    }
    CYX_CHECK(gpu.empty() || p.value.device() == device, typeName(), ".step: the parameters are on ", device.str(),
              " and ", p.value.device().str(), "; keep a model on one device");
    device = p.value.device();
    gpu.push_back({p.value.deviceData<float>() + first, p.grad.deviceData<float>() + first,
                   slots.size() > 0 ? slots[0].deviceData<float>() : nullptr,
                   slots.size() > 1 ? slots[1].deviceData<float>() : nullptr, n});
  }
  if (!gpu.empty()) updateOnDevice(device, gpu);
}

Optimizer::Span Optimizer::spanOf(size_t i, Parameter& p, int64_t first, int64_t last, const float* grad) {
  const int64_t begin = shard_.empty() ? 0 : shard_.at(i).first;  // where the slots' elements start
  Span span{p.value.data<float>() + first, grad, last - first, {nullptr, nullptr}};
  const std::vector<Tensor>* slots = slots_.empty() ? nullptr : &slots_.at(i);
  CYX_CHECK(!slots || slots->size() <= 2, typeName(), ": more than two state buffers per parameter (an engine bug)");
  for (size_t s = 0; slots && s < slots->size(); ++s) span.slots[s] = (*slots)[s].data<float>() + (first - begin);
  return span;
}

void Optimizer::updateRange(size_t i, const std::vector<Parameter*>& params, int64_t first, int64_t last,
                            const float* grad) {
  Parameter& p = *params.at(i);
  const int64_t begin = shard_.empty() ? 0 : shard_.at(i).first;
  const int64_t end = shard_.empty() ? p.value.numel() : shard_.at(i).second;
  CYX_CHECK(!p.value.isCuda() && begin <= first && first <= last && last <= end, typeName(),
            ": elements [", first, ", ", last, ") of parameter ", i, " are not this rank's CPU elements [", begin, ", ",
            end, ") (an engine bug)");
  if (last > first) update(spanOf(i, p, first, last, grad));
}

void Optimizer::zeroGrad(SequentialModel& model) { model.zeroGrad(); }

OptimizerState Optimizer::scalars() const {
  OptimizerState out;
  out.scalars["step"] = static_cast<double>(steps_);
  out.scalars["lr"] = lr_;
  hyperParameters(out.scalars);
  return out;
}

OptimizerState Optimizer::state(const GatherSlot& gather) const {
  if (!slotsSharded_) return state();
  OptimizerState out = scalars();
  std::vector<std::string> names = slotNames();
  for (size_t s = 0; s < names.size() && !slots_.empty(); ++s) {
    std::vector<Tensor> parts;
    for (const std::vector<Tensor>& buffers : slots_) parts.push_back(buffers[s]);
    std::vector<Tensor> whole = gather(parts);
    for (size_t i = 0; i < whole.size(); ++i) out.tensors[makeString(names[s], ".", i)] = whole[i].to(Device{});
  }
  return out;
}

OptimizerState Optimizer::state() const {
  CYX_CHECK(!slotsSharded_, rankPrefix(), typeName(), ".state_dict: this optimizer's state is sharded across ranks by "
            "DistributedDataParallel (shard_optimizer=True); call ddp.optimizer_state_dict(optimizer) on every rank, "
            "which puts the shards together");
  OptimizerState out = scalars();
  std::vector<std::string> names = slotNames();
  for (size_t i = 0; i < slots_.size(); ++i) {
    for (size_t s = 0; s < names.size(); ++s) {
      const Tensor& buffer = slots_[i][s];
      out.tensors[makeString(names[s], ".", i)] = buffer.isCuda() ? buffer.to(Device{}) : buffer.clone();
    }
  }
  return out;
}

void Optimizer::loadState(const OptimizerState& state) {
  auto step = state.scalars.find("step");
  auto lr = state.scalars.find("lr");
  CYX_CHECK(step != state.scalars.end() && lr != state.scalars.end() && step->second >= 0, typeName(),
            ".load_state_dict: the state has no valid 'step' and 'lr' entries");
  checkHyperParameter(lr->second >= 0.0, typeName() + ".load_state_dict", "lr", lr->second, "it must be >= 0");
  std::vector<std::string> names = slotNames();
  std::vector<std::vector<Tensor>> slots;
  for (size_t i = 0;; ++i) {
    std::vector<Tensor> buffers;
    for (const std::string& name : names) {
      auto it = state.tensors.find(makeString(name, ".", i));
      if (it == state.tensors.end()) break;
      CYX_CHECK(it->second.dtype() == DType::Float32, typeName(), ".load_state_dict: '", name, ".", i, "' must be float32");
      CYX_CHECK(buffers.empty() || it->second.shape() == buffers[0].shape(), typeName(), ".load_state_dict: '", name, ".", i,
                "' has shape ", shapeString(it->second.shape()), " but its sibling buffers have ", shapeString(buffers[0].shape()));
      buffers.push_back(it->second.to(Device{}).clone());
    }
    if (buffers.empty() || names.empty()) break;
    CYX_CHECK(buffers.size() == names.size(), typeName(), ".load_state_dict: parameter ", i, " lacks some of its buffers");
    slots.push_back(std::move(buffers));
  }
  CYX_CHECK(state.tensors.size() == slots.size() * names.size(), typeName(),
            ".load_state_dict: the state holds tensors this optimizer does not know (was it saved by another optimizer type?)");
  slots_ = std::move(slots);
  slotsSharded_ = false;  // whole buffers: the next step keeps this rank's shard of them
  steps_ = static_cast<int64_t>(step->second);
  setLearningRate(lr->second);
}

}  // namespace cyxwiz::nn
