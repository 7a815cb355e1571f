#include "cyxwiz/comm/work.h"

#include <thread>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

std::string Work::description() const {
  return makeString("[rank ", rank_, "/", worldSize_, "] ", call_.describe());
}

void Work::poll(bool block) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poller_ || completed_) return;
  }
  try {
    if (!poller_(block)) return;
  } catch (...) {
    finish(std::current_exception());
    return;
  }
  finish();
}

bool Work::isCompleted() {
  poll(false);
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Work::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::wait() {
  poll(true);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return completed_; });
  if (error_) std::rethrow_exception(error_);
}

bool Work::waitFor(std::chrono::milliseconds timeout) {
  if (poller_) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!isCompleted() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_.wait_for(lock, timeout, [this] { return completed_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    error_ = error;
  }
  done_.notify_all();
}

}  // namespace cyxwiz::comm
