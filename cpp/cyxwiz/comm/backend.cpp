#include "cyxwiz/comm/backend.h"

#include <atomic>

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm {

namespace {
std::atomic<InterruptCheck> gInterruptCheck{nullptr};
}  // namespace

void setInterruptCheck(InterruptCheck check) { gInterruptCheck = check; }
InterruptCheck interruptCheck() { return gInterruptCheck.load(); }

void throwIfInterrupted(const char* what) {
  InterruptCheck check = gInterruptCheck.load();
  if (check != nullptr && check()) throw Interrupted(makeString(rankPrefix(), what, ": interrupted (KeyboardInterrupt)"));
}

Backend::~Backend() = default;

void Backend::unsupported(const char* collective) const {
  throw BackendError(makeString(rankPrefix(), "backend ", name(), " does not support ", collective));
}

std::shared_ptr<Work> Backend::allReduce(const Tensor&, ReduceOp, bool) { unsupported("all_reduce"); }
std::shared_ptr<Work> Backend::broadcast(const Tensor&, int, bool) { unsupported("broadcast"); }
std::shared_ptr<Work> Backend::allGather(const Tensor&, const Tensor&, bool) { unsupported("all_gather"); }
std::shared_ptr<Work> Backend::reduceScatter(const Tensor&, const Tensor&, ReduceOp, bool) { unsupported("reduce_scatter"); }
std::shared_ptr<Work> Backend::barrier(bool) { unsupported("barrier"); }
bool Backend::reducesRounded(const Tensor&) const { return false; }
std::shared_ptr<Work> Backend::allReduceRounded(const Tensor&, DType, float, ReduceOp, bool, bool) {
  unsupported("all_reduce (16-bit, rounded in place)");
}
bool Backend::reducesForStep(const Tensor&) const { return false; }
void Backend::reduceForStep(const Tensor&, ReduceOp, bool, DType, float, const Collectives::StepConsumer&) {
  unsupported("all_reduce (read by the optimizer step)");
}
std::shared_ptr<Work> Backend::gather(const Tensor&, const Tensor&, int, bool) { unsupported("gather"); }
std::shared_ptr<Work> Backend::scatter(const Tensor&, const Tensor&, int, bool) { unsupported("scatter"); }
std::shared_ptr<Work> Backend::allToAll(const Tensor&, const Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&,
                                        bool) {
  unsupported("all_to_all");
}
std::shared_ptr<Work> Backend::send(const Tensor&, int, int64_t) { unsupported("send"); }
std::shared_ptr<Work> Backend::recv(const Tensor&, int, int64_t) { unsupported("recv"); }

void Backend::setCapturing(bool) { unsupported("CUDA graph capture"); }
void Backend::computeWaitsForCollectives() { unsupported("CUDA graph capture"); }
void Backend::awaitReplay(void*, const std::string&) { unsupported("CUDA graph capture"); }
void Backend::addGraphHolder(GraphHolder*) { unsupported("CUDA graph capture"); }
void Backend::removeGraphHolder(GraphHolder*) {}

namespace {
// Part r of `data` (numpy.array_split), as a view.
Tensor partOf(const Tensor& data, int parts, int r) {
  const auto count = static_cast<size_t>(data.numel());
  const size_t first = partBegin(count, parts, r), last = partBegin(count, parts, r + 1);
  return data.view(static_cast<int64_t>(first), {static_cast<int64_t>(last - first)});
}
}  // namespace

std::shared_ptr<Work> Backend::reduceScatterInPlace(const Tensor& data, ReduceOp op, bool) {
  Tensor mine = partOf(data, worldSize(), rank());
  Tensor out = Tensor::empty(mine.shape(), data.dtype(), data.device());
  std::shared_ptr<Work> work = reduceScatter(data, out, op, false);
  work->wait();
  mine.copyFrom(out);
  return work;
}

std::shared_ptr<Work> Backend::allGatherInPlace(const Tensor& data, bool) {
  // allGather takes equal blocks: every part padded to the first (the largest).
  const int n = worldSize();
  const int64_t largest = partOf(data, n, 0).numel();
  Tensor block = Tensor::zeros({largest}, data.dtype(), data.device());
  Tensor mine = partOf(data, n, rank());
  block.view(0, mine.shape()).copyFrom(mine);
  Tensor all = Tensor::empty({largest * n}, data.dtype(), data.device());
  std::shared_ptr<Work> work = allGather(block, all, false);
  work->wait();
  for (int r = 0; r < n; ++r) {
    Tensor part = partOf(data, n, r);
    part.copyFrom(all.view(r * largest, part.shape()));
  }
  return work;
}

Tensor Backend::sharedZeros(int64_t elements, DType dtype) { return Tensor::zeros({elements}, dtype); }

bool Backend::allAgree(bool ok) {
  Tensor flag = Tensor::zeros({1}, DType::Int32);
  *static_cast<int32_t*>(flag.rawData()) = ok ? 1 : 0;
  allReduce(flag, ReduceOp::Min, false)->wait();
  return *static_cast<const int32_t*>(flag.rawData()) == 1;
}

CallSignature callSignature(Collective c, const Tensor& t, ReduceOp op, int root) {
  CallSignature s;
  s.collective = c;
  s.op = op;
  s.dtype = t.defined() ? t.dtype() : DType::Float32;
  s.count = t.defined() ? static_cast<uint64_t>(t.numel()) : 0;
  s.root = static_cast<uint32_t>(root);
  return s;
}

}  // namespace cyxwiz::comm
