// Work: the handle of one collective. The communication thread finishes it; callers wait on it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace cyxwiz::comm {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  bool isCompleted() const;
  bool isSuccess() const;             // completed without an error
  std::exception_ptr exception() const;
  // Blocks until the collective is done and rethrows its error. The collective itself is bounded by
  // the backend's timeout, so this never waits forever.
  void wait();
  // As wait(), but gives up after `timeout`: false when the collective is still running.
  bool waitFor(std::chrono::milliseconds timeout);
  const std::string& description() const { return description_; }

  // Called once, by the thread that ran the collective.
  void finish(std::exception_ptr error = nullptr);

 private:
  std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool completed_ = false;
  std::exception_ptr error_;
};

}  // namespace cyxwiz::comm
