#include "cyxwiz/ddp/buckets.h"

namespace cyxwiz::ddp {

GradientBuckets::GradientBuckets(nn::SequentialModel& model, size_t capBytes, size_t firstCapBytes,
                                 const std::function<Tensor(int64_t)>& allocate) {
  // A module's parameters become ready together (its backward reports them at once), so they share
  // a bucket. Modules are assigned in reverse order; one that would take its bucket past the cap
  // starts a new one, so a small last layer is not held back by a large layer before it, and a
  // module larger than the cap gets a bucket of its own.
  std::vector<std::vector<nn::Module*>> groups;
  size_t bytes = 0;
  const auto& modules = model.modules();
  for (size_t k = modules.size(); k-- > 0;) {
    size_t size = 0;
    for (nn::Parameter* p : modules[k]->parameters()) size += p->value.nbytes();
    if (size == 0) continue;
    const size_t cap = groups.size() <= 1 ? firstCapBytes : capBytes;
    if (groups.empty() || (bytes > 0 && bytes + size > cap)) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(modules[k].get());
    bytes += size;
  }

  // Parameter indices as model.parameters() numbers them.
  std::map<const nn::Parameter*, size_t> index;
  for (nn::Parameter* p : model.parameters()) index.emplace(p, index.size());
  parameterCount_ = index.size();

  for (const auto& group : groups) {
    Bucket b;
    int64_t elements = 0;
    for (nn::Module* m : group) {
      for (nn::Parameter* p : m->parameters()) elements += p->value.numel();
    }
    b.storage = allocate(elements);
    int64_t offset = 0;
    for (nn::Module* m : group) {
      for (nn::Parameter* p : m->parameters()) {
        Tensor view = b.storage.view(offset, p->value.shape());
        if (p->grad.defined()) view.copyFrom(p->grad);  // keep what was accumulated before wrapping
        p->grad = view;
        offset += p->value.numel();
        b.params.push_back(index.at(p));
      }
      byModule_[m].push_back(buckets_.size());
    }
    b.layers = static_cast<int>(group.size());
    buckets_.push_back(std::move(b));
  }
}

const std::vector<size_t>& GradientBuckets::bucketsOf(const nn::Module* module) const {
  static const std::vector<size_t> none;
  auto it = byModule_.find(module);
  return it == byModule_.end() ? none : it->second;
}

}  // namespace cyxwiz::ddp
