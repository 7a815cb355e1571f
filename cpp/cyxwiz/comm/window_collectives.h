// Collectives of a group through a Window (window.h): every member reads the others' memory
// directly, with no socket and no copy through the kernel.
//
// all_reduce, large: in chunks of half a slot. Round 1: each rank copies into its half the parts of
// the chunk that the others reduce; then reduces its own 1/N part, reading every rank's copy (its
// own straight from its array) in rank order, into its other half and its array. Round 2: each rank
// copies the other N-1 reduced parts into its array. Each part is reduced by one rank, so all get
// its bits.
// all_reduce, small: one round. Each rank copies its whole array in and reduces all N copies in rank
// order: the same bits on every rank, and one wait (no syscall when the peers are on time).
// broadcast, all_gather, reduce_scatter: one round per chunk. barrier: one round with no data.
// The first round of every call checks the call headers (Window::arrive): a mismatch is an error
// naming the other rank's call, never wrong numbers.
#pragma once

#include <functional>
#include <vector>

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/window.h"

namespace cyxwiz::comm {

class WindowCollectives : public Collectives {
 public:
  // All-reduces of at most this many bytes (and fitting a half) take the one-round path.
  static constexpr size_t kSmallBytes = 32 * 1024;

  WindowCollectives(Window& window, const CallSignature& call) : w_(window), call_(call) {}

  void allReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void allGather(const void* in, void* out, size_t bytesPerRank) override;
  void reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override;
  // One round per window of half a slot: each rank copies in the others' parts of it and reduces its
  // own, reading its own copy from its array (any order: only its owner computes a part). On a
  // shared buffer larger than a half: two rounds, our part reduced from the buffers where they lie
  // in rank order (the same bits as allReduce).
  void reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) override;
  // One round per half a slot of the largest part. On a shared buffer larger than a half: two
  // rounds, the others' parts copied from their buffers.
  void allGatherInPlace(void* data, size_t count, DType dtype) override;
  // On a shared float32 buffer larger than a half: allReduceShared's / reduceScatterInPlace's rounds,
  // each part reduced from the peers' float32 buffers, rounding as it reads (reduce.h): no 16-bit copy,
  // no conversion passes before or after.
  void allReduceRounded(float* data, size_t count, DType wire, float scale, ReduceOp op, bool partial) override;
  // On a shared float32 buffer larger than a half: one round in which each piece is reduced from every
  // member's buffer in rank order (reduceShared's bits, or reduceSharedRounded's for a 16-bit wire) into
  // a cache-sized buffer and handed on. The plain (not partial) 16-bit step takes two: this member's part
  // rounded in place in its buffer piece by piece, then the others' parts read where they lie.
  void reduceForStep(const float* data, size_t count, ReduceOp op, bool partial, DType wire, float scale,
                     const StepConsumer& consume) override;
  void barrier() override { w_.arrive(); }
  void checkCalls() override { w_.arrive(); }
  const CallSignature& call() const override { return call_; }

 private:
  void allReduceSmall(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  void allReduceChunk(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  // The call covers a shared buffer (CallSignature::buffer): each member reduces its part reading the
  // others' buffers where they lie, then copies the others' reduced parts: no copy into the halves.
  void allReduceShared(uint8_t* data, size_t count, DType dtype, ReduceOp op);
  // Its rounds, with `reducePart(of, d, first, last)` reducing bytes [first, last) of the buffers into d.
  using PartReducer = std::function<void(const std::vector<const uint8_t*>&, uint8_t*, size_t, size_t)>;
  void allReduceSharedWith(uint8_t* data, size_t count, size_t esz, const PartReducer& reducePart);
  // Every member's copy of the call's shared buffer; throws when one is not mapped here.
  std::vector<const uint8_t*> sharedBuffers() const;
  // Bytes [first, last) of the shared buffers `of` reduced in rank order into d.
  static void reduceShared(const std::vector<const uint8_t*>& of, uint8_t* d, size_t first, size_t last, DType dtype,
                           ReduceOp op);
  // The same, each piece handed to `consume` instead of copied to d (elements, not bytes).
  static void reduceSharedInto(const std::vector<const uint8_t*>& of, const void* near, size_t first, size_t last,
                               DType dtype, ReduceOp op, const StepConsumer& consume);
  // The same over float32 buffers, as the 16-bit exchange rounds (reduce.h's roundScaled, sumRounded).
  static void reduceSharedRounded(const std::vector<const uint8_t*>& of, uint8_t* d, size_t first, size_t last,
                                  DType wire, float scale, ReduceOp op);
  // reduceSharedInto's pieces with reduceSharedRounded's bits (elements, not bytes); with `into` (this
  // member's buffer) each piece is rounded in place there and handed on from there.
  static void reduceSharedRoundedInto(const std::vector<const uint8_t*>& of, const void* near, size_t first,
                                      size_t last, DType wire, float scale, ReduceOp op, const StepConsumer& consume,
                                      float* into = nullptr);

  Window& w_;
  CallSignature call_;
};

}  // namespace cyxwiz::comm
