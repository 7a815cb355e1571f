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

  // Assign in reverse order; a bucket closes once it reaches its cap.
  std::vector<std::vector<size_t>> groups;
  size_t bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    if (groups.empty() || bytes >= (groups.size() == 1 ? firstCapBytes : capBytes)) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += params[i].second->value.nbytes();
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
