// Ring collectives: rank r receives from rank r-1 (its left) and sends to rank r+1 (its right).
//
// all_reduce, large: reduce-scatter then all-gather over N chunks. In reduce-scatter step s a rank
// sends chunk r-s-1 and receives chunk r-s-2, reducing it into its own copy segment by segment as
// it arrives; after N-1 steps rank r holds chunk r summed over every rank. In all-gather step s it
// sends chunk r-s (the finished one it got last) and receives chunk r-s-1 in place. Each rank moves
// 2(N-1)/N of the buffer: the bandwidth optimum.
// all_reduce, small: every rank gathers every rank's whole buffer (N-1 steps, no chunking), then
// reduces them in rank order: fewer rounds, and the same bits on every rank.
//
// The first step of every collective carries this rank's CallHeader; a rank compares the header
// from its left with its own call and raises on any difference (size, dtype, op, order), so ranks
// that disagree get an error, never wrong numbers.
//
// The ring knows its peers only as members of `Links` (links.h): the same algorithm runs over TCP
// (tcp/links.h) and through shared memory (shm/links.h).
#pragma once

#include <cstdint>
#include <vector>

#include "cyxwiz/comm/call_header.h"
#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/links.h"
#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm {

class Ring : public Collectives {
 public:
  // Messages at most this large (times N-1) take the small path.
  static constexpr size_t kSmallBytes = 64 * 1024;
  // The large all-reduce's slices grow with the world so that a step moves at least this much.
  static constexpr size_t kMinStepBytes = 64 * 1024;

  // Small all-reduces take recursive doubling when the group is a power of two of 4 or more and
  // `links` reach every partner (member r XOR 2^k). sliceBytes: the large all-reduce's slice
  // (DistributedConfig::ringSliceBytes).
  Ring(Links& links, std::vector<uint8_t>& scratch, const CallSignature& call, size_t sliceBytes = size_t{1} << 20);

  void allReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void allGather(const void* in, void* out, size_t bytesPerRank) override;
  // Rank r gets part r of the reduced input, parts split as numpy.array_split splits.
  void reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override;
  void reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) override;
  void allGatherInPlace(void* data, size_t count, DType dtype) override;
  void barrier() override;
  // One step that carries only the headers: every rank's call is checked against its left
  // neighbour's, so the whole ring agrees (collectives whose data travels elsewhere).
  void checkCalls() override;
  const CallSignature& call() const override { return call_; }

 private:
  int mod(int i) const { return ((i % size_) + size_) % size_; }
  // One step, receiving from the left and sending to the right unless partners are named; the first
  // of a collective also sends our header and checks the one received.
  void step(std::vector<platform::IoVec> send, std::vector<platform::IoVec> recv, Step&& extra = Step(), int from = -1, int to = -1);
  void checkHeader(int from);
  bool canDouble() const;
  void gatherBlocks(uint8_t* blocks, size_t bytesPerRank);
  // Recursive doubling: in round k exchange the whole partial result with rank r XOR 2^k and
  // combine, lower rank's operand first, so that both partners compute the same bits.
  void recursiveDoubling(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  void ringAllReduce(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  // The first `steps` reduce-scatter steps (N-1 for all of them).
  void reduceScatterSteps(uint8_t* data, size_t count, DType dtype, ReduceOp op, uint8_t* recvBuf, int steps);
  // All-gather steps from `first` on: step s passes on chunk r-s and receives chunk r-s-1 in place.
  void allGatherSteps(uint8_t* data, size_t count, size_t esz, int first);

  Links& links_;
  int rank_, size_;
  std::vector<uint8_t>& scratch_;
  CallSignature call_;
  size_t sliceBytes_;
  uint8_t myHeader_[kCallHeaderBytes];
  uint8_t theirHeader_[kCallHeaderBytes];
  bool headerSent_ = false;
};

}  // namespace cyxwiz::comm
