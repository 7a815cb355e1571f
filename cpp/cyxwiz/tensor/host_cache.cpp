#include "cyxwiz/tensor/host_cache.h"

#include <algorithm>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cyxwiz/common/env.h"
#include "cyxwiz/platform/memory.h"
#include "cyxwiz/platform/process.h"

namespace cyxwiz::host_cache {
namespace {

// glibc's default mmap threshold: below it the heap's own bins reuse freed memory without faults.
constexpr size_t kMinBlockBytes = size_t{128} << 10;
// Kept + live may pass the peak of live bytes by an eighth. With no slack, a Transformer step (2 blocks,
// d_model 128, 64 x 16 tokens) missed 13 times a step: near its peak the blocks kept were of the wrong
// sizes (2 MiB kept, 512 KiB wanted, and back); with an eighth, none after the first step.
constexpr size_t kSlackDivisor = 8;

struct Block {
  void* p;
  size_t bytes;
};

class Cache {
 public:
  Cache() : enabled_(envFlag("CYXWIZ_HOST_CACHE", true)) {}

  void* allocate(size_t bytes) {
    if (!enabled_ || bytes < kMinBlockBytes) return platform::alignedAlloc(64, bytes);
    std::vector<void*> evicted;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = bySize_.find(bytes);
      if (found != bySize_.end() && !found->second.empty()) {
        // The most recently freed block of the size: the likeliest to be in cache still.
        auto it = found->second.back();
        found->second.pop_back();
        p = it->p;
        lru_.erase(it);
        cached_ -= bytes;
        ++hits_;
      } else {
        ++misses_;
        const size_t want = std::max(peakLive_ + peakLive_ / kSlackDivisor, live_ + bytes);
        while (!lru_.empty() && live_ + bytes + cached_ > want) evicted.push_back(evictOldest());
      }
      live_ += bytes;
      peakLive_ = std::max(peakLive_, live_);
    }
    for (void* q : evicted) platform::alignedFree(q);
    if (p) return p;
    p = platform::alignedAlloc(64, bytes);
    if (!p) {  // out of memory: what the cache keeps may be what the system lacks
      emptyCache();
      p = platform::alignedAlloc(64, bytes);
    }
    if (!p) {
      std::lock_guard<std::mutex> lock(mutex_);
      live_ -= bytes;
    }
    return p;
  }

  void release(void* p, size_t bytes) {
    if (!p) return;
    if (!enabled_ || bytes < kMinBlockBytes) return platform::alignedFree(p);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_ -= bytes;  // live + cached is unchanged (or lower): the bound still holds
      if (!direct_) {
        lru_.push_front(Block{p, bytes});
        bySize_[bytes].push_back(lru_.begin());
        cached_ += bytes;
        return;
      }
    }
    platform::alignedFree(p);
  }

  void setDirect(bool begin) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      direct_ += begin ? 1 : -1;
    }
    if (begin) emptyCache();
  }

  void emptyCache() {
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!lru_.empty()) evicted.push_back(evictOldest());
      peakLive_ = live_;  // the bound restarts from what is live now
    }
    for (void* q : evicted) platform::alignedFree(q);
  }

  Stats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    Stats s;
    s.enabled = enabled_;
    s.minBlockBytes = kMinBlockBytes;
    s.liveBytes = live_;
    s.peakLiveBytes = peakLive_;
    s.cachedBytes = cached_;
    s.cachedBlocks = lru_.size();
    s.hits = hits_;
    s.misses = misses_;
    s.evictions = evictions_;
    return s;
  }

  // fork(): the child must not inherit the lock held (pthread_atfork handlers).
  void lockForFork() { mutex_.lock(); }
  void unlockAfterFork() { mutex_.unlock(); }

 private:
  // Caller holds the lock; returns the block to free once it is released.
  void* evictOldest() {
    Block b = lru_.back();
    // Blocks of one size are in release order, oldest first, so the oldest of all is its size's front.
    auto& sameSize = bySize_[b.bytes];
    sameSize.pop_front();
    if (sameSize.empty()) bySize_.erase(b.bytes);
    lru_.pop_back();
    cached_ -= b.bytes;
    ++evictions_;
    return b.p;
  }

  const bool enabled_;
  int direct_ = 0;  // ReleaseDirectly scopes open
  std::mutex mutex_;
  std::list<Block> lru_;  // front: the most recently released
  std::unordered_map<size_t, std::deque<std::list<Block>::iterator>> bySize_;
  size_t live_ = 0, peakLive_ = 0, cached_ = 0;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

Cache& cache() {
  // Never destroyed: tensors that outlive static destruction (Python's at exit) still release here.
  static Cache* instance = [] {
    auto* c = new Cache();
    platform::atFork([] { cache().lockForFork(); }, [] { cache().unlockAfterFork(); },
                     [] { cache().unlockAfterFork(); });
    return c;
  }();
  return *instance;
}

}  // namespace

void* allocate(size_t bytes) { return cache().allocate(bytes); }
void release(void* p, size_t bytes) { cache().release(p, bytes); }
void emptyCache() { cache().emptyCache(); }
ReleaseDirectly::ReleaseDirectly() { cache().setDirect(true); }
ReleaseDirectly::~ReleaseDirectly() { cache().setDirect(false); }
Stats stats() { return cache().stats(); }

}  // namespace cyxwiz::host_cache
