// TEST DOUBLE, NOT GPU SUPPORT. Events. A record outside a capture is a marker item in the stream's
// queue: the event completes when the worker passes it (an event never recorded counts as complete).
// cudaStreamWaitEvent enqueues a wait on the record made just before it (later records do not move
// it), which blocks that stream's worker until the marker is passed. A record inside a capture is a
// point of the graph instead: a wait on it pulls the waiting stream into the capture, and querying or
// synchronising it fails with cudaErrorCapturedEvent (invalidating the capture while it lasts).
#include <atomic>
#include <chrono>
#include <set>

#include "internal.h"

struct CUevent_st {
  unsigned flags = 0;
  int dev = 0;
  // The last record outside a capture: complete when stream->done >= seq.
  cxemu::Stream* stream = nullptr;
  uint64_t seq = 0;
  std::shared_ptr<std::atomic<int64_t>> stamp;  // steady-clock ns when the marker was passed
  // The last record inside a capture (0: none).
  uint64_t captureId = 0;
  std::vector<int> tail;
};

namespace cxemu {

namespace {

std::set<CUevent_st*>& events() {
  static auto* e = new std::set<CUevent_st*>;  // never destroyed (workers may outlive main)
  return *e;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Checks shared by query and synchronize (stateMutex held): the handle, the sticky error, a capture.
cudaError_t checkWaitableLocked(CUevent_st* ev, const char* call) {
  if (!events().count(ev)) return setLastError(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = checkSticky(ev->dev)) return e;
  if (ev->captureId) {
    invalidateLocked(ev->captureId, std::string(call) + " of an event recorded in the capture");
    return setLastError(cudaErrorCapturedEvent);
  }
  return cudaSuccess;
}

}  // namespace

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~unsigned(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))) {
    return setLastError(cudaErrorInvalidValue);
  }
  const int dev = currentDevice();
  const cudaError_t e = deviceError(dev);
  if (e != cudaSuccess) return setLastError(e == cudaErrorInvalidValue ? cudaErrorNoDevice : e);
  if (cudaError_t st = checkSticky(dev)) return st;
  auto* ev = new CUevent_st;
  ev->flags = flags;
  ev->dev = dev;
  std::lock_guard<std::mutex> lock(stateMutex());
  events().insert(ev);
  *event = ev;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  if (flags & ~unsigned(cudaEventRecordExternal)) return setLastError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!events().count(event)) return setLastError(cudaErrorInvalidResourceHandle);
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (event->dev != s->dev) {
    return failWhy(cudaErrorInvalidResourceHandle, "cudaEventRecord of an event of cuda:" + std::to_string(event->dev) +
                                                       " on " + s->name());
  }
  if (s->captureId) {
    if (captureInvalidatedLocked(s->captureId)) return setLastError(cudaErrorStreamCaptureInvalidated);
    event->captureId = s->captureId;
    event->tail = captureTailLocked(s);
    event->stream = nullptr;
    return cudaSuccess;
  }
  if (cudaError_t e = legacyImplicitLocked(s)) return e;
  auto stamp = std::make_shared<std::atomic<int64_t>>(0);
  Item marker;
  marker.what = "cudaEventRecord";
  marker.delay = false;
  marker.skipWhenLost = false;
  marker.fn = [stamp] { stamp->store(nowNs()); };
  event->seq = submit(s, std::move(marker));
  event->stream = s;
  event->stamp = stamp;
  event->captureId = 0;
  event->tail.clear();
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return cudaEventRecordWithFlags(event, stream, cudaEventRecordDefault);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (cudaError_t e = checkWaitableLocked(event, "cudaEventQuery")) return e;
    s = event->stream;
    seq = event->seq;
  }
  if (!s) return cudaSuccess;
  std::lock_guard<std::mutex> sl(s->m);
  return s->done >= seq ? cudaSuccess : setLastError(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Stream* s = nullptr;
  uint64_t seq = 0;
  int dev = 0;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (cudaError_t e = checkWaitableLocked(event, "cudaEventSynchronize")) return e;
    s = event->stream;
    seq = event->seq;
    dev = event->dev;
  }
  if (!s) return cudaSuccess;
  const int timeout = syncTimeoutMs();
  if (!waitDone(s, seq, timeout)) {
    return failWhy(cudaErrorTimeout, "cudaEventSynchronize gave up after " + std::to_string(timeout) +
                                         " ms (CYXWIZ_EMULATED_SYNC_TIMEOUT_MS): " + s->name() +
                                         " never reached the event");
  }
  return checkSticky(dev);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!events().erase(event)) return setLastError(cudaErrorInvalidResourceHandle);
  delete event;  // waits already enqueued hold (stream, seq), not the event
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return setLastError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!events().count(start) || !events().count(end)) return setLastError(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return setLastError(cudaErrorInvalidResourceHandle);
  if (!start->stamp || !end->stamp) return setLastError(cudaErrorInvalidResourceHandle);
  const int64_t a = start->stamp->load(), b = end->stamp->load();
  if (a == 0 || b == 0) return setLastError(cudaErrorNotReady);
  *ms = static_cast<float>(double(b - a) / 1e6);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags & ~unsigned(cudaEventWaitExternal)) return setLastError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!events().count(event)) return setLastError(cudaErrorInvalidResourceHandle);
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (event->captureId && captureActiveLocked(event->captureId)) {
    return captureJoinLocked(s, event->captureId, event->tail);
  }
  if (s->captureId) {
    if (captureInvalidatedLocked(s->captureId)) return setLastError(cudaErrorStreamCaptureInvalidated);
    if (!event->stream) return cudaSuccess;  // never recorded (or only in an ended capture): nothing to wait for
    invalidateLocked(s->captureId, "cudaStreamWaitEvent on " + s->name() + " for an event recorded outside the capture");
    return setLastError(cudaErrorStreamCaptureIsolation);
  }
  if (!event->stream) return cudaSuccess;
  if (cudaError_t e = legacyImplicitLocked(s)) return e;
  Item wait;
  wait.what = "cudaStreamWaitEvent";
  wait.delay = false;
  wait.skipWhenLost = false;
  wait.deps.push_back({event->stream, event->seq});
  submit(s, std::move(wait));
  return cudaSuccess;
}

}  // extern "C"
