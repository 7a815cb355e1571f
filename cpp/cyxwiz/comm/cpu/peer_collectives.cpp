// What CpuBackend does over the point-to-point links (tcp/p2p.h): send and recv, and the collectives
// where each rank's data goes to one rank only (gather, scatter, all_to_all), which a ring would
// relay through every rank between. Each such collective is queued with the ring's, so it runs in
// issue order with them and under the same contract (every rank calls it, in the same order); its
// calls are checked around the ring first (one step of headers: ranks that disagree get the ring's
// mismatch error), its messages carry a tag naming the call, and a size that differs is an error.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "cyxwiz/comm/cpu/cpu_backend.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::cpu {

using tcp::collectiveTag;

namespace {

// Elements [offset, offset + count) of `t`, flat.
Tensor block(const Tensor& t, int64_t offset, int64_t count) { return t.view(offset, {count}); }

void waitAll(const std::vector<std::shared_ptr<Work>>& parts) {
  // Each part ends within the timeout (tcp/p2p.h); the first error is the collective's.
  std::exception_ptr first;
  for (const auto& p : parts) {
    try {
      p->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

void CpuBackend::checkPeer(const char* what, const Tensor& data, int peer, bool anySource) {
  requireCpu(data, what);
  const int n = config_.worldSize;
  CYX_CHECK(n > 1, what, ": there is no other rank to talk to in a world of one");
  if (anySource && peer == -1) return;
  CYX_CHECK(peer >= 0 && peer < n && peer != config_.rank, what, ": ", peer, " is not another rank: expected one of 0..",
            n - 1, " except this rank, ", config_.rank);
}

std::shared_ptr<Work> CpuBackend::pointToPoint(Collective kind, const Tensor& data, int peer, int64_t tag) {
  const char* what = collectiveName(kind);
  checkPeer(what, data, peer, kind == Collective::Recv);
  CYX_CHECK(tag >= 0, what, ": tag ", tag, " is negative; tags are 0 or more (negative ones are the backend's own)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) std::rethrow_exception(broken_);
    if (closed_) throw DistError(makeString(rankPrefix(), what, ": the process group was finalized; call init() again first"));
  }
  CallSignature call = callSignature(kind, data, ReduceOp::Sum, peer < 0 ? 0 : peer);
  if (peer < 0) call.root = kAnySource;
  call.tag = tag;
  call.sequence = ++p2pSequence_;
  return kind == Collective::Send ? p2p_->send(data, peer, tag, call) : p2p_->recv(data, peer, tag, call);
}

std::shared_ptr<Work> CpuBackend::send(const Tensor& data, int dst, int64_t tag) {
  return pointToPoint(Collective::Send, data, dst, tag);
}

std::shared_ptr<Work> CpuBackend::recv(const Tensor& data, int src, int64_t tag) {
  return pointToPoint(Collective::Recv, data, src, tag);
}

std::shared_ptr<Work> CpuBackend::gather(const Tensor& in, const Tensor& out, int dst, bool async) {
  requireCpu(in, "gather");
  const int n = config_.worldSize, me = config_.rank;
  CYX_CHECK(dst >= 0 && dst < n, "gather: dst=", dst, " is not a rank: expected 0..", n - 1);
  if (me == dst) {
    requireCpu(out, "gather");
    CYX_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * n,
              "gather: the output must hold world_size x ", in.numel(), " elements of ", dtypeName(in.dtype()));
  }
  return submit(callSignature(Collective::Gather, in, ReduceOp::Sum, dst), async, [this, in, out, dst, n, me](Collectives& ring) {
    ring.checkCalls();
    const int64_t tag = collectiveTag(ring.call()), count = in.numel();
    std::vector<std::shared_ptr<Work>> parts;
    if (me != dst) {
      parts.push_back(p2p_->send(in, dst, tag, ring.call()));
    } else {
      for (int r = 0; r < n; ++r) {
        if (r != me) parts.push_back(p2p_->recv(block(out, r * count, count), r, tag, ring.call()));
      }
      std::memcpy(static_cast<uint8_t*>(out.rawData()) + static_cast<size_t>(me) * in.nbytes(), in.rawData(), in.nbytes());
    }
    waitAll(parts);
  });
}

std::shared_ptr<Work> CpuBackend::scatter(const Tensor& in, const Tensor& out, int src, bool async) {
  requireCpu(out, "scatter");
  const int n = config_.worldSize, me = config_.rank;
  CYX_CHECK(src >= 0 && src < n, "scatter: src=", src, " is not a rank: expected 0..", n - 1);
  if (me == src) {
    requireCpu(in, "scatter");
    CYX_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * n,
              "scatter: the input must hold world_size x ", out.numel(), " elements of ", dtypeName(out.dtype()));
  }
  return submit(callSignature(Collective::Scatter, out, ReduceOp::Sum, src), async, [this, in, out, src, n, me](Collectives& ring) {
    ring.checkCalls();
    const int64_t tag = collectiveTag(ring.call()), count = out.numel();
    std::vector<std::shared_ptr<Work>> parts;
    if (me != src) {
      parts.push_back(p2p_->recv(out, src, tag, ring.call()));
    } else {
      for (int r = 0; r < n; ++r) {
        if (r != me) parts.push_back(p2p_->send(block(in, r * count, count), r, tag, ring.call()));
      }
      std::memcpy(out.rawData(), static_cast<const uint8_t*>(in.rawData()) + static_cast<size_t>(me) * out.nbytes(), out.nbytes());
    }
    waitAll(parts);
  });
}

std::shared_ptr<Work> CpuBackend::allToAll(const Tensor& in, const Tensor& out, const std::vector<int64_t>& inCounts,
                                           const std::vector<int64_t>& outCounts, bool async) {
  requireCpu(in, "all_to_all");
  requireCpu(out, "all_to_all");
  const int n = config_.worldSize, me = config_.rank;
  CYX_CHECK(in.dtype() == out.dtype(), "all_to_all: input and output dtypes differ (", dtypeName(in.dtype()), ", ",
            dtypeName(out.dtype()), ")");
  for (const auto* counts : {&inCounts, &outCounts}) {
    const bool input = counts == &inCounts;
    CYX_CHECK(counts->size() == static_cast<size_t>(n), "all_to_all: ", input ? "input" : "output", " split sizes: ",
              counts->size(), " given, one per rank (", n, ") expected");
    CYX_CHECK(std::all_of(counts->begin(), counts->end(), [](int64_t c) { return c >= 0; }), "all_to_all: negative split size");
    int64_t total = std::accumulate(counts->begin(), counts->end(), int64_t{0});
    CYX_CHECK(total == (input ? in.numel() : out.numel()), "all_to_all: the ", input ? "input" : "output",
              " split sizes add up to ", total, " elements, but the ", input ? "input" : "output", " holds ",
              input ? in.numel() : out.numel());
  }
  CYX_CHECK(inCounts[static_cast<size_t>(me)] == outCounts[static_cast<size_t>(me)], "all_to_all: this rank sends itself ",
            inCounts[static_cast<size_t>(me)], " elements but expects ", outCounts[static_cast<size_t>(me)], " from itself");
  // Element counts may differ between ranks (uneven splits): the header compares the rest.
  return submit(callSignature(Collective::AllToAll, Tensor::empty({0}, in.dtype())), async, [this, in, out, inCounts, outCounts, n, me](Collectives& ring) {
    ring.checkCalls();
    const int64_t tag = collectiveTag(ring.call());
    std::vector<std::shared_ptr<Work>> parts;
    int64_t inAt = 0, outAt = 0;
    for (int r = 0; r < n; ++r) {
      const auto ri = static_cast<size_t>(r);
      if (r == me) {
        std::memcpy(static_cast<uint8_t*>(out.rawData()) + static_cast<size_t>(outAt) * itemSize(out.dtype()),
                    static_cast<const uint8_t*>(in.rawData()) + static_cast<size_t>(inAt) * itemSize(in.dtype()),
                    static_cast<size_t>(inCounts[ri]) * itemSize(in.dtype()));
      } else {
        parts.push_back(p2p_->recv(block(out, outAt, outCounts[ri]), r, tag, ring.call()));
        parts.push_back(p2p_->send(block(in, inAt, inCounts[ri]), r, tag, ring.call()));
      }
      inAt += inCounts[ri];
      outAt += outCounts[ri];
    }
    waitAll(parts);
  });
}

}  // namespace cyxwiz::comm::cpu
