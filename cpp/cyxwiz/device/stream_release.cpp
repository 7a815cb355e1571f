#include "cyxwiz/device/stream_release.h"

#include <deque>
#include <mutex>
#include <utility>

#include "cyxwiz/device/cuda.h"

namespace cyxwiz::device {

namespace {

struct Pending {
  int dev;
  void* event;  // null: the event could not be recorded; synchronise before releasing
  std::shared_ptr<void> owner;
};

std::mutex& pendingMutex() {
  static auto* m = new std::mutex;  // never destroyed: releases may come during exit
  return *m;
}

std::deque<Pending>& pending() {
  static auto* q = new std::deque<Pending>;
  return *q;
}

void enqueueRelease(int dev, std::shared_ptr<void> owner) noexcept {
  cuda::Api* api = tryCudaApi();
  void* event = nullptr;
  if (!api || !api->recordComputeEvent(dev, &event).empty()) {
    // No runtime (exit) or a broken device: nothing more can run on the stream that could read it.
    return;  // `owner` is released here
  }
  try {
    std::lock_guard<std::mutex> lock(pendingMutex());
    pending().push_back(Pending{dev, event, std::move(owner)});
  } catch (...) {
    api->synchronize(dev);  // out of memory for the queue entry: wait instead
    api->eventRelease(event);
  }
}

}  // namespace

std::shared_ptr<void> releasedAfterCompute(int dev, std::shared_ptr<void> owner) {
  drainStreamReleases();
  return std::shared_ptr<void>(owner.get(), [dev, owner](void*) mutable { enqueueRelease(dev, std::move(owner)); });
}

void drainStreamReleases(bool wait) noexcept {
  cuda::Api* api = tryCudaApi();
  if (!api) return;
  std::deque<Pending> ready;
  {
    std::lock_guard<std::mutex> lock(pendingMutex());
    auto& q = pending();
    // In release order: events of one device complete in order, so stop at the first unfinished one.
    while (!q.empty()) {
      bool done = false;
      if (wait) api->synchronize(q.front().dev);
      if (!api->eventQuery(q.front().event, &done).empty()) done = true;  // a failed device runs nothing more
      if (!done) break;
      ready.push_back(std::move(q.front()));
      q.pop_front();
    }
  }
  // Outside the lock: an owner's release may call back into Python (queued for the GIL, gil.h).
  for (Pending& p : ready) api->eventRelease(p.event);
}

}  // namespace cyxwiz::device
