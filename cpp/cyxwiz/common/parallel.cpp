#include "cyxwiz/common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "cyxwiz/platform/process.h"
#include "cyxwiz/tensor/blas.h"

namespace cyxwiz {

namespace {

// Workers wait for a new generation, take parts until none is left, and report when done. The pool
// lives for the process (detached workers: nothing to join at exit, and they hold no resources).
class Pool {
 public:
  void run(int64_t n, int parts, const std::function<void(int64_t, int64_t)>& body) {
    std::lock_guard<std::mutex> one(callMutex_);  // one job at a time, whoever calls
    grow(parts - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &body;
      n_ = n;
      parts_ = parts;
      next_ = 0;
      unfinished_ = parts;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return unfinished_ == 0; });
    body_ = nullptr;
  }

 private:
  void grow(int workers) {
    while (static_cast<int>(threads_) < workers) {
      std::thread([this, seen = generationNow()]() mutable { loop(seen); }).detach();
      ++threads_;
    }
  }

  uint64_t generationNow() {
    std::lock_guard<std::mutex> lock(mutex_);
    return generation_;
  }

  void loop(uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
      }
      work();
    }
  }

  // Takes parts of the current job until none is left.
  void work() {
    for (;;) {
      int part;
      const std::function<void(int64_t, int64_t)>* body;
      int64_t n;
      int parts;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!body_ || next_ >= parts_) return;
        part = next_++;
        body = body_;
        n = n_;
        parts = parts_;
      }
      (*body)(n * part / parts, n * (part + 1) / parts);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--unfinished_ == 0) done_.notify_one();
    }
  }

  std::mutex callMutex_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0, next_ = 0, unfinished_ = 0;
  uint64_t generation_ = 0;
  size_t threads_ = 0;
};

}  // namespace

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  const int64_t byWork = grain > 0 ? n / grain : n;
  const int parts = static_cast<int>(std::min<int64_t>(std::max(1, blas::numThreads()), std::max<int64_t>(byWork, 1)));
  if (parts <= 1) {
    if (n > 0) body(0, n);
    return;
  }
  // Never destroyed: detached workers may still be waiting in it at exit. A fork()ed child has none of
  // its parent's workers: it starts a pool of its own (the parent's is left as it is).
  static std::mutex mutex;
  static Pool* pool = nullptr;
  static long owner = 0;
  Pool* mine;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!pool || owner != platform::currentPid()) {
      pool = new Pool;
      owner = platform::currentPid();
    }
    mine = pool;
  }
  mine->run(n, parts, body);
}

}  // namespace cyxwiz
