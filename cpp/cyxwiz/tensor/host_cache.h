// Host tensor memory: blocks of 128 KiB and more that a tensor (or a kernel's Scratch) frees are kept
// for the next one of the same size, so a training loop (the same shapes every step) stops handing its
// activations back to the kernel and faulting them in again page by page, as glibc's munmap and heap
// trims made it: a Transformer step took 453 page faults without the cache and 217 with it
// (benchmarks/results/host_cache_epyc_2core.md).
//
// The bound: the bytes of live blocks plus the bytes kept never exceed the peak of live bytes so far
// by more than an eighth. A miss that would cross it first frees the oldest kept blocks, so the cache
// holds about what the process needed before, not more; exact-size reuse also leaves less of glibc's
// fragmentation (one Transformer step at 1024 tokens: peak RSS growth 110 MiB against 129 without).
// emptyCache() returns it all (cx.empty_cache()); CYXWIZ_HOST_CACHE=0 turns the cache off (every
// block straight back to the C library, as before).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace cyxwiz::host_cache {

// 64-byte aligned memory of at least `bytes` (a multiple of 64); nullptr when out of memory.
void* allocate(size_t bytes);
// Gives back a block from allocate(bytes), with the same `bytes`.
void release(void* p, size_t bytes);
// Frees every kept block.
void emptyCache();

// While one exists (any thread), released blocks go straight back to the C library, and the cache is
// emptied when it is made: for code that moves a model's tensors elsewhere (into DDP's buckets, to a
// GPU), whose old blocks no step will ask for again and whose peak must not hold both copies.
class ReleaseDirectly {
 public:
  ReleaseDirectly();
  ~ReleaseDirectly();
  ReleaseDirectly(const ReleaseDirectly&) = delete;
  ReleaseDirectly& operator=(const ReleaseDirectly&) = delete;
};

struct Stats {
  bool enabled = false;
  size_t minBlockBytes = 0;  // smaller blocks bypass the cache
  size_t liveBytes = 0;      // blocks handed out and not yet released (cached sizes only)
  size_t peakLiveBytes = 0;
  size_t cachedBytes = 0;
  size_t cachedBlocks = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;    // kept blocks freed to make room under the bound
};
Stats stats();

// A kernel's scratch buffer of n uninitialised T (at least one), from the cache: a temporary the next
// call of the same shape takes again instead of faulting in new pages.
template <class T>
class Scratch {
 public:
  explicit Scratch(int64_t n)
      : bytes_((static_cast<size_t>(n > 1 ? n : 1) * sizeof(T) + 63) / 64 * 64),
        p_(static_cast<T*>(allocate(bytes_))) {
    if (!p_) throw std::bad_alloc();
  }
  Scratch(Scratch&& other) noexcept : bytes_(other.bytes_), p_(std::exchange(other.p_, nullptr)) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch& operator=(Scratch&&) = delete;
  ~Scratch() { release(p_, bytes_); }
  T* get() const { return p_; }

 private:
  size_t bytes_;
  T* p_;
};

}  // namespace cyxwiz::host_cache
