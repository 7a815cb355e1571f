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
#pragma once

#include <cstdint>
#include <vector>

#include "cyxwiz/comm/call_header.h"
#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/tcp/duplex.h"
#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm::tcp {

class Ring : public Collectives {
 public:
  // Messages at most this large (times N-1) take the small path.
  static constexpr size_t kSmallBytes = 64 * 1024;
  // The large all-reduce's slices grow with the world so that a step moves at least this much.
  static constexpr size_t kMinStepBytes = 64 * 1024;

  // partners[k-1]: the link to rank r XOR 2^k (k >= 1), present in power-of-two worlds of 4+.
  // sliceBytes: the large all-reduce's slice (DistributedConfig::ringSliceBytes).
  Ring(int rank, int size, Duplex& io, std::vector<uint8_t>& scratch, const CallSignature& call,
       Pair* left = nullptr, Pair* right = nullptr, std::vector<Pair>* partners = nullptr,
       size_t sliceBytes = size_t{1} << 20);

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
  // One step; the first of a collective also sends our header and checks the left one's.
  void step(std::vector<iovec> send, std::vector<iovec> recv, Step&& extra = Step());
  void checkLeftHeader();
  void gatherBlocks(uint8_t* blocks, size_t bytesPerRank);
  // Recursive doubling: in round k exchange the whole partial result with rank r XOR 2^k and
  // combine, lower rank's operand first, so that both partners compute the same bits.
  void recursiveDoubling(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  void ringAllReduce(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  // The first `steps` reduce-scatter steps (N-1 for all of them).
  void reduceScatterSteps(uint8_t* data, size_t count, DType dtype, ReduceOp op, uint8_t* recvBuf, int steps);
  // All-gather steps from `first` on: step s passes on chunk r-s and receives chunk r-s-1 in place.
  void allGatherSteps(uint8_t* data, size_t count, size_t esz, int first);

  int rank_, size_;
  Duplex& io_;
  std::vector<uint8_t>& scratch_;
  CallSignature call_;
  Pair* left_;
  Pair* right_;
  std::vector<Pair>* partners_;
  size_t sliceBytes_;
  uint8_t myHeader_[kCallHeaderBytes];
  uint8_t leftHeader_[kCallHeaderBytes];
  bool headerSent_ = false;
};

}  // namespace cyxwiz::comm::tcp
