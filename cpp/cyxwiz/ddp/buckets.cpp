#include "cyxwiz/ddp/buckets.h"

#include <algorithm>
#include <set>

namespace cyxwiz::ddp {

GradientBuckets::GradientBuckets(nn::SequentialModel& model, size_t capBytes, size_t firstCapBytes) {
  // Which parameter (by index into model.parameters()) belongs to which module.
  std::vector<std::pair<nn::Module*, nn::Parameter*>> params;
  for (const auto& m : model.modules()) {
    for (nn::Parameter* p : m->parameters()) params.emplace_back(m.get(), p);
  }
  parameterCount_ = params.size();

  // Assign in reverse order. A parameter that would take its bucket past the cap starts a new one,
  // so a small last layer is not held back until a large layer before it is done; a parameter
  // larger than the cap gets a bucket of its own.
  std::vector<std::vector<size_t>> groups;
  size_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const size_t size = params[i].second->value.nbytes();
    const size_t cap = groups.size() <= 1 ? firstCapBytes : capBytes;
    if (groups.empty() || (bytes > 0 && bytes + size > cap)) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += size;
  }

  for (const auto& group : groups) {
    Bucket b;
    int64_t elements = 0;
    for (size_t i : group) elements += params[i].second->value.numel();
    b.storage = Tensor::zeros({elements});
    int64_t offset = 0;
    std::set<const nn::Module*> modules;
    for (size_t i : group) {
      nn::Parameter* p = params[i].second;
      Tensor view = b.storage.view(offset, p->value.shape());
      if (p->grad.defined()) view.copyFrom(p->grad);  // keep what was accumulated before wrapping
      p->grad = view;
      offset += p->value.numel();
      modules.insert(params[i].first);
    }
    b.params = group;
    b.layers = static_cast<int>(modules.size());
    for (const nn::Module* m : modules) byModule_[m].push_back(buckets_.size());
    buckets_.push_back(std::move(b));
  }
}

const std::vector<size_t>& GradientBuckets::bucketsOf(const nn::Module* module) const {
  static const std::vector<size_t> none;
  auto it = byModule_.find(module);
  return it == byModule_.end() ? none : it->second;
}

}  // namespace cyxwiz::ddp
