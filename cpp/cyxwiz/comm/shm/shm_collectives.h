// Collectives of one host's ranks through their shared segment (group.h), with no socket and no copy
// through the kernel.
//
// all_reduce, large: in chunks of half a slot. Round 1: each rank copies into its half the parts of
// the chunk that the others reduce; then reduces its own 1/N part, reading every rank's copy (its
// own straight from its array) in rank order, into its other half and its array. Round 2: each rank
// copies the other N-1 reduced parts into its array. Each part is reduced by one rank, so all get
// its bits.
// all_reduce, small: one round. Each rank copies its whole array in and reduces all N copies in rank
// order: the same bits on every rank, and one wait (no syscall when the peers are on time).
// broadcast, all_gather, reduce_scatter: one round per chunk. barrier: one round with no data.
//
// Waiting: spin on the peer's phase for the spin budget, then sleep on it as a futex in slices,
// between which the job monitor (a peer's failure or death), Ctrl-C, finalize() and the peer's pid
// are checked. A wait with no progress for the timeout fails naming the peer, as on TCP. The first
// round of every call compares the call headers of all ranks: a mismatch is an error naming the
// other rank's call, never wrong numbers.
#pragma once

#include <atomic>
#include <chrono>

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/comm/monitor.h"
#include "cyxwiz/comm/shm/group.h"
#include "cyxwiz/comm/work.h"

namespace cyxwiz::comm::shm {

class ShmCollectives : public Collectives {
 public:
  // All-reduces of at most this many bytes (and fitting a half) take the one-round path.
  static constexpr size_t kSmallBytes = 32 * 1024;

  // As Duplex (cpu/duplex.h): `work` names the call in errors, `spin` bounds busy waiting,
  // `interrupted` (may be null) is asked between sleeps, `finalizing` says finalize() stopped us.
  ShmCollectives(Group& group, const CallSignature& call, Monitor* monitor, int64_t timeoutMs, const Work& work,
                 std::chrono::microseconds spin, bool (*interrupted)(), const std::atomic<bool>* finalizing);

  void allReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void allGather(const void* in, void* out, size_t bytesPerRank) override;
  void reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override;
  // One round per window of half a slot: each rank copies in the others' parts of it and reduces its
  // own, reading its own copy from its array (any order: only its owner computes a part).
  void reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) override;
  // One round per half a slot of the largest part.
  void allGatherInPlace(void* data, size_t count, DType dtype) override;
  void barrier() override { arrive(); }
  void checkCalls() override { arrive(); }
  const CallSignature& call() const override { return call_; }

 private:
  // The half the next round writes.
  int nextHalf() { return static_cast<int>(g_.rounds++ & 1); }
  // This rank's half h, once every peer has finished reading what it last held; its data placed
  // for fast copies to and from `like` (Group::place).
  uint8_t* writable(int h, const void* like);
  // Publish the next phase and wait until every peer has; the call's first also checks headers.
  void arrive();
  // This rank has read the peers' half h of the current round.
  void doneReading(int h) { g_.readDone[h] = g_.phase + 1; }
  void publish();
  void waitAll(uint32_t phase);
  void waitFor(int peer, uint32_t phase);
  // Between sleeps: the monitor, Ctrl-C, finalize(), the peer's pid and the deadline.
  void checkWhileWaiting(int peer, uint32_t phase, Deadline deadline);
  void checkHeaders();
  void allReduceSmall(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  void allReduceChunk(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  std::string what() const { return work_.description(); }

  Group& g_;
  CallSignature call_;
  Monitor* monitor_;
  int64_t timeoutMs_;
  const Work& work_;
  std::chrono::microseconds spin_;
  bool (*interrupted_)();
  const std::atomic<bool>* finalizing_;
  uint8_t myHeader_[wire::kCallHeaderBytes];
  bool started_ = false;
};

}  // namespace cyxwiz::comm::shm
