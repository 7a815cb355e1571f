// Work: the handle of one collective. The communication thread finishes it; callers wait on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm {

class Work {
 public:
  // The description ("[rank 1/4] all_reduce #7 (float32, 1000 elements, SUM)") is formatted only
  // when a message needs it: the latency path pays for no strings.
  Work(const CallSignature& call, int rank, int worldSize) : call_(call), rank_(rank), worldSize_(worldSize) {}

  bool isCompleted();
  bool isSuccess() const;             // completed without an error
  std::exception_ptr exception() const;
  // Blocks until the collective is done and rethrows its error. The collective itself is bounded by
  // the backend's timeout, so this never waits forever.
  void wait();
  // As wait(), but gives up after `timeout`: false when the collective is still running.
  bool waitFor(std::chrono::milliseconds timeout);
  std::string description() const;
  const CallSignature& call() const { return call_; }
  // The rank a finished recv's message came from (-1 for every other kind of work).
  int sourceRank() const { return sourceRank_.load(); }
  void setSourceRank(int rank) { sourceRank_.store(rank); }

  // Called once, by the thread that ran the collective.
  void finish(std::exception_ptr error = nullptr);

  // For collectives that finish on a GPU rather than on a thread (NCCL): `poll(block)` returns true
  // once the collective is done (with block, after waiting for it, bounded by the backend's
  // timeout) and throws its error. wait(), waitFor() and isCompleted() then ask it.
  using Poller = std::function<bool(bool block)>;
  void setPoller(Poller poll) { poller_ = std::move(poll); }

 private:
  CallSignature call_;
  int rank_, worldSize_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool completed_ = false;
  std::exception_ptr error_;
  Poller poller_;
  std::atomic<int> sourceRank_{-1};
  // Asks the poller (if any, and not yet completed), finishing the work when it reports done or fails.
  void poll(bool block);
};

}  // namespace cyxwiz::comm
