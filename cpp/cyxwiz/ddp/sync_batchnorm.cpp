#include "cyxwiz/ddp/sync_batchnorm.h"

#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/nn/batchnorm.h"

namespace cyxwiz::ddp {

namespace {

int convert(const std::vector<std::shared_ptr<nn::Module>>& modules) {
  int changed = 0;
  for (const auto& m : modules) {
    if (auto* bn = dynamic_cast<nn::BatchNormModule*>(m.get())) {
      changed += bn->synchronized() ? 0 : 1;
      bn->setSynchronized(true);
    }
    changed += convert(m->children());
  }
  return changed;
}

}  // namespace

int convertSyncBatchNorm(nn::SequentialModel& model) {
  installSyncBatchNorm();
  return convert(model.modules());
}

void installSyncBatchNorm() {
  nn::setStatsAllReduce([](const Tensor& values) {
    if (!comm::isInitialized()) return false;
    std::shared_ptr<comm::Backend> backend = comm::backend("SyncBatchNorm");
    if (backend->worldSize() < 2) return false;
    // On a GPU under NCCL the sums stay there; a CPU backend stages them through the host.
    backend->allReduce(values, comm::ReduceOp::Sum, false)->wait();
    return true;
  });
}

}  // namespace cyxwiz::ddp
