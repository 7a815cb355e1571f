#include "cyxwiz/comm/hierarchical.h"

#include "cyxwiz/comm/reduce.h"

namespace cyxwiz::comm {

void Hierarchical::allReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  // Avg is a sum until the end, divided once by the whole world.
  const ReduceOp inner = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  if (count * itemSize(dtype) <= smallBytes_) {
    // Latency first: one local round gives every local rank its host's sum (the same bits on all),
    // and every ring across hosts reduces the whole buffer, in host order: the same bits everywhere.
    local_.allReduce(data, count, dtype, inner);
    across_.allReduce(data, count, dtype, inner);
    if (op == ReduceOp::Avg) finishAverage(data, count, dtype, worldSize_);
    return;
  }
  local_.reduceScatterInPlace(data, count, dtype, inner);
  const size_t esz = itemSize(dtype), first = partBegin(count, localSize_, localIndex_);
  const size_t mine = partBegin(count, localSize_, localIndex_ + 1) - first;
  void* part = static_cast<uint8_t*>(data) + first * esz;
  // Every rank joins its ring across hosts, even with an empty part: the ring checks the calls.
  across_.allReduce(part, mine, dtype, inner);
  if (op == ReduceOp::Avg) finishAverage(part, mine, dtype, worldSize_);
  local_.allGatherInPlace(data, count, dtype);
}

}  // namespace cyxwiz::comm
