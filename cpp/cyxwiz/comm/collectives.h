// Collectives: what an algorithm over one transport offers the backend. The ring (ring.h, over TCP or
// shared-memory Links) and the algorithms over a shared-memory window (window_collectives.h) implement it; the
// hierarchical all-reduce (hierarchical.h) composes them through it; CpuBackend queues calls
// against it and never cares which one runs them.
#pragma once

#include <cstddef>
#include <functional>

#include "cyxwiz/comm/types.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual void allReduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void allGather(const void* in, void* out, size_t bytesPerRank) = 0;
  // Rank r gets part r of the reduced input, parts split as numpy.array_split splits.
  virtual void reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  // The halves of an all-reduce, in place on `data`, parts as partBegin splits them among the
  // group. After reduceScatterInPlace this rank's part holds the reduction (Avg: divided by the
  // group's size); the other parts hold anything. allGatherInPlace sends every rank's part to all.
  virtual void reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void allGatherInPlace(void* data, size_t count, DType dtype) = 0;
  // The 16-bit gradient exchange (ddp/wire.h) of a float32 buffer: bit for bit what rounding data *
  // scale to `wire` on every rank, all-reducing that (partial: reduce-scattering, this rank's part
  // only) and widening the result back would leave in data. Only the shared-window algorithms
  // offer it, on a buffer every rank maps (CpuBackend::reducesRounded); the others throw.
  virtual void allReduceRounded(float* data, size_t count, DType wire, float scale, ReduceOp op, bool partial);
  // DDP's optimizer step reading the reduction as it is made (ddp.h, "Fused step"): consume(first, last,
  // reduced) gets elements [first, last) of the reduction of every rank's float32 `data` (the bits
  // all_reduce would leave there; partial: this rank's part only), a cache-sized piece at a time, in
  // order within each rank's part, and `data` is left as it was. Returns once no rank reads this rank's
  // buffer any more. wire: float32, or the 16-bit type of a rounded exchange: then the pieces are
  // allReduceRounded's bits (scale as there), and where not partial this rank's part of `data` holds them
  // after (each rank rounds its part once, in place, this rank's part first, then the others' are read).
  // Only the shared-window algorithms offer it, on a buffer every rank maps (CpuBackend::reducesForStep).
  using StepConsumer = std::function<void(size_t first, size_t last, const float* reduced)>;
  virtual void reduceForStep(const float* data, size_t count, ReduceOp op, bool partial, DType wire, float scale,
                             const StepConsumer& consume);
  virtual void barrier() = 0;
  // Only checks that every rank made this same call (collectives whose data travels elsewhere).
  virtual void checkCalls() = 0;
  virtual const CallSignature& call() const = 0;
};

inline void Collectives::allReduceRounded(float*, size_t, DType, float, ReduceOp, bool) {
  throw BackendError(call().describe() + ": the rounded 16-bit exchange needs the shared-window algorithms on "
                     "a buffer every rank maps (an engine bug: CpuBackend::reducesRounded said yes)");
}

inline void Collectives::reduceForStep(const float*, size_t, ReduceOp, bool, DType, float, const StepConsumer&) {
  throw BackendError(call().describe() + ": a reduction read by the optimizer step needs the shared-window "
                     "algorithms on a buffer every rank maps (an engine bug: CpuBackend::reducesForStep said yes)");
}

// First element of part i when `count` elements are split in `parts` (numpy.array_split).
inline size_t partBegin(size_t count, int parts, int i) {
  size_t q = count / static_cast<size_t>(parts), r = count % static_cast<size_t>(parts);
  size_t k = static_cast<size_t>(i);
  return k * q + (k < r ? k : r);
}

}  // namespace cyxwiz::comm
