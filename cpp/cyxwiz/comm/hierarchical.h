// Hierarchical collectives for a job of several hosts with L ranks each: all_reduce is
//   1. a reduce-scatter inside each host (shared memory): local rank l holds part l of its host's sum;
//   2. an all-reduce of part l across the hosts, among the L ranks with local index l (each on a ring
//      of its own, so that all L of a host's ranks drive the link at once);
//   3. an all-gather inside each host.
// Per host and direction the link carries 2(H-1)/H of the buffer, where a flat ring through every
// rank carries 2(N-1)/N of it over each of its hops between hosts. Up to `smallBytes` the local phase
// is one all-reduce and every ring across hosts carries the whole buffer: one local round fewer.
// The other collectives move little data in training and keep to the flat ring over every rank.
#pragma once

#include "cyxwiz/comm/collectives.h"

namespace cyxwiz::comm {

class Hierarchical : public Collectives {
 public:
  // local: this host's ranks, by local index. across: this rank's counterparts on the other hosts.
  // flat: every rank of the job. worldSize: for Avg.
  Hierarchical(Collectives& local, Collectives& across, Collectives& flat, int localSize, int localIndex, int worldSize,
               size_t smallBytes)
      : local_(local), across_(across), flat_(flat), localSize_(localSize), localIndex_(localIndex), worldSize_(worldSize),
        smallBytes_(smallBytes) {}

  void allReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override { flat_.broadcast(data, bytes, root); }
  void allGather(const void* in, void* out, size_t bytesPerRank) override { flat_.allGather(in, out, bytesPerRank); }
  void reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    flat_.reduceScatter(in, out, count, dtype, op);
  }
  void reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) override {
    flat_.reduceScatterInPlace(data, count, dtype, op);
  }
  void allGatherInPlace(void* data, size_t count, DType dtype) override { flat_.allGatherInPlace(data, count, dtype); }
  void barrier() override { flat_.barrier(); }
  void checkCalls() override { flat_.checkCalls(); }
  const CallSignature& call() const override { return flat_.call(); }

 private:
  Collectives& local_;
  Collectives& across_;
  Collectives& flat_;
  int localSize_, localIndex_, worldSize_;
  size_t smallBytes_;
};

}  // namespace cyxwiz::comm
