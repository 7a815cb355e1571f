#include "cyxwiz/comm/backend.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm {

Backend::~Backend() = default;

void Backend::unsupported(const char* collective) const {
  throw BackendError(makeString(rankPrefix(), "backend ", name(), " does not support ", collective));
}

std::shared_ptr<Work> Backend::allReduce(const Tensor&, ReduceOp, bool) { unsupported("all_reduce"); }
std::shared_ptr<Work> Backend::broadcast(const Tensor&, int, bool) { unsupported("broadcast"); }
std::shared_ptr<Work> Backend::allGather(const Tensor&, const Tensor&, bool) { unsupported("all_gather"); }
std::shared_ptr<Work> Backend::reduceScatter(const Tensor&, const Tensor&, ReduceOp, bool) { unsupported("reduce_scatter"); }
std::shared_ptr<Work> Backend::barrier(bool) { unsupported("barrier"); }

}  // namespace cyxwiz::comm
