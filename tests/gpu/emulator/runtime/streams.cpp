// TEST DOUBLE, NOT GPU SUPPORT. Streams: each is a worker thread running its queue in order,
// asynchronously from the host, with a random delay (0..CYXWIZ_EMULATED_DELAY_US, default 2000 us,
// seeded per stream) before each piece of work so that missing synchronisation shows. The host sees
// results only after a synchronising call.
//
// The default streams, per device: the legacy stream (nullptr, cudaStreamLegacy) and one per-thread
// stream per host thread (cudaStreamPerThread). The legacy stream's implicit synchronisation is
// modelled at submission: an item on the legacy stream waits for the work already submitted to every
// blocking stream (created without cudaStreamNonBlocking, per-thread streams included) of its device,
// and an item on a blocking stream waits for the work already submitted to the legacy stream.
//
// Workers are detached and never joined: a worker blocked in a wait that never completes (an event
// behind a hung collective) cannot hold up process exit. Streams are never deleted (a destroyed
// stream's worker drains its queue and ends), so a handle stays unique for the life of the process.
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "internal.h"

namespace cxemu {

namespace {

struct Streams {
  std::set<Stream*> live;
  Stream* legacy[kMaxDevices] = {};
  std::vector<Stream*> byDev[kMaxDevices];
  int serial = 0;
};

Streams& streams() {
  static Streams* s = new Streams;  // never destroyed (workers may outlive main)
  return *s;
}

thread_local Stream* tPerThread[kMaxDevices] = {};

void workerLoop(Stream* s) {
  for (;;) {
    {
      Item item;
      {
        std::unique_lock<std::mutex> lock(s->m);
        s->cv.wait(lock, [s] { return !s->queue.empty() || s->destroyed; });
        if (s->queue.empty()) return;  // destroyed and drained
        item = std::move(s->queue.front());
        s->queue.pop_front();
      }
      for (const Dep& d : item.deps) waitDone(d.stream, d.seq, -1);
      const int delay = maxDelayUs();
      if (item.delay && delay > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(s->rng() % (unsigned(delay) + 1)));
      }
      execute(s->dev, item, "");
    }  // the item (and what its closure holds) is released before the host can see it done
    {
      std::lock_guard<std::mutex> lock(s->m);
      ++s->done;
    }
    s->cv.notify_all();
  }
}

Stream* newStreamLocked(int dev, unsigned flags, bool legacy, bool perThread) {
  Streams& all = streams();
  auto* s = new Stream;
  s->dev = dev;
  s->flags = flags;
  s->legacy = legacy;
  s->perThread = perThread;
  s->serial = ++all.serial;
  s->rng.seed(static_cast<unsigned>(envInt("CYXWIZ_EMULATED_SEED", 0, 0, 1 << 30)) * 1000003u +
              static_cast<unsigned>(s->serial));
  try {
    std::thread(workerLoop, s).detach();
  } catch (...) {
    delete s;
    return nullptr;
  }
  all.live.insert(s);
  all.byDev[dev].push_back(s);
  return s;
}

// The work that `s` must wait for under the legacy stream's implicit synchronisation.
std::vector<Dep> implicitDepsLocked(Stream* s) {
  std::vector<Dep> deps;
  if (s->legacy) {
    for (Stream* b : streams().byDev[s->dev]) {
      if (b != s && b->blocking()) deps.push_back({b, submittedOf(b)});
    }
  } else if (s->blocking()) {
    if (Stream* l = streams().legacy[s->dev]) deps.push_back({l, submittedOf(l)});
  }
  return deps;
}

int remainingMs(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

// An operation on the legacy stream while a blocking stream of its device captures would make the
// legacy stream depend on captured work: CUDA refuses it and invalidates those captures.
cudaError_t legacyImplicitLocked(Stream* s) {
  if (!s->legacy) return cudaSuccess;
  bool refused = false;
  for (Stream* b : streams().byDev[s->dev]) {
    if (b->blocking() && b->captureId) {
      invalidateLocked(b->captureId, "an operation on the legacy stream of cuda:" + std::to_string(s->dev));
      refused = true;
    }
  }
  return refused ? setLastError(cudaErrorStreamCaptureImplicit) : cudaSuccess;
}

std::string Stream::name() const {
  if (legacy) return "the legacy stream of cuda:" + std::to_string(dev);
  return std::string(perThread ? "the per-thread stream " : "stream ") + std::to_string(serial) + " of cuda:" +
         std::to_string(dev);
}

std::mutex& stateMutex() {
  static std::mutex* m = new std::mutex;  // never destroyed (workers may outlive main)
  return *m;
}

Stream* legacyStreamLocked(int dev) {
  Streams& all = streams();
  if (!all.legacy[dev]) all.legacy[dev] = newStreamLocked(dev, cudaStreamDefault, true, false);
  return all.legacy[dev];
}

std::vector<Stream*> streamsOfLocked(int dev) { return streams().byDev[dev]; }

Stream* resolveStreamLocked(cudaStream_t h, cudaError_t* err) {
  const auto v = reinterpret_cast<uintptr_t>(h);
  if (v <= 2) {
    const int dev = currentDevice();
    const cudaError_t e = deviceError(dev);
    if (e != cudaSuccess) {
      *err = e == cudaErrorInvalidValue ? cudaErrorNoDevice : e;
      return nullptr;
    }
    Stream* s = nullptr;
    if (v == 2) {
      if (!tPerThread[dev]) tPerThread[dev] = newStreamLocked(dev, cudaStreamDefault, false, true);
      s = tPerThread[dev];
    } else {
      s = legacyStreamLocked(dev);
    }
    if (!s) *err = cudaErrorMemoryAllocation;
    return s;
  }
  auto* s = reinterpret_cast<Stream*>(h);
  if (!streams().live.count(s)) {
    *err = cudaErrorInvalidResourceHandle;
    return nullptr;
  }
  return s;
}

Stream* resolveStream(cudaStream_t h, cudaError_t* err) {
  std::lock_guard<std::mutex> lock(stateMutex());
  return resolveStreamLocked(h, err);
}

uint64_t submittedOf(Stream* s) {
  std::lock_guard<std::mutex> lock(s->m);
  return s->submitted;
}

uint64_t submit(Stream* s, Item item) {
  std::vector<Dep> implicit = implicitDepsLocked(s);
  item.deps.insert(item.deps.end(), implicit.begin(), implicit.end());
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(s->m);
    s->queue.push_back(std::move(item));
    seq = ++s->submitted;
  }
  s->cv.notify_all();
  return seq;
}

bool waitDone(Stream* s, uint64_t seq, int timeoutMs) {
  std::unique_lock<std::mutex> lock(s->m);
  auto ready = [s, seq] { return s->done >= seq; };
  if (timeoutMs < 0) {
    s->cv.wait(lock, ready);
    return true;
  }
  return s->cv.wait_for(lock, std::chrono::milliseconds(timeoutMs), ready);
}

void execute(int dev, Item& item, const char* context) {
  if (item.skipWhenLost && stickyError(dev) != cudaSuccess) return;
  std::string why;
  for (const Access& a : item.accesses) {
    if (!accessOk(a, dev, item.peer, &why)) {
      loseContext(dev, cudaErrorIllegalAddress,
                  item.what + " on cuda:" + std::to_string(dev) + " touched " + hexPtr(a.ptr) + " (" +
                      std::to_string(a.bytes) + " bytes) " + why + context);
      return;
    }
  }
  if (item.fn) item.fn();
  // Freed by another stream while this work ran: a race the GPU would not report, but a bug.
  for (const Access& a : item.accesses) {
    if (!accessOk(a, dev, item.peer, &why)) {
      loseContext(dev, cudaErrorIllegalAddress,
                  item.what + " on cuda:" + std::to_string(dev) + " was still using " + hexPtr(a.ptr) + " (" +
                      std::to_string(a.bytes) + " bytes) when it became " + why + context);
      return;
    }
  }
}

cudaError_t launchItem(Stream* s, Item item, bool kernel) {
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (kernel && s->dev != currentDevice()) {
    return failWhy(cudaErrorInvalidResourceHandle, item.what + " launched on " + s->name() + " while cuda:" +
                                                       std::to_string(currentDevice()) + " is current");
  }
  std::lock_guard<std::mutex> lock(stateMutex());
  if (s->captureId) return captureRecordLocked(s, item);
  if (cudaError_t e = legacyImplicitLocked(s)) return e;
  submit(s, std::move(item));
  return cudaSuccess;
}

cudaError_t enqueue(cudaStream_t stream, const char* what, std::vector<Access> accesses, std::function<void()> work) {
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(stream, &err);
  if (!s) return setLastError(err);
  Item item;
  item.what = what;
  item.accesses = std::move(accesses);
  item.fn = std::move(work);
  // NCCL runs its collectives on the communicator's device whatever the calling thread's is.
  const bool kernel = std::strncmp(what, "nccl", 4) != 0;
  return launchItem(s, std::move(item), kernel);
}

bool isDeviceRange(const void* ptr, size_t bytes, int dev) { return deviceRange(ptr, bytes, dev, true); }

int streamDevice(cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(stream, &err);
  return s ? s->dev : -1;
}

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int /*priority*/) {
  if (!pStream || (flags & ~unsigned(cudaStreamNonBlocking))) return setLastError(cudaErrorInvalidValue);
  const int dev = currentDevice();
  const cudaError_t e = deviceError(dev);
  if (e != cudaSuccess) return setLastError(e == cudaErrorInvalidValue ? cudaErrorNoDevice : e);
  if (cudaError_t st = checkSticky(dev)) return st;
  std::lock_guard<std::mutex> lock(stateMutex());
  Stream* s = newStreamLocked(dev, flags, false, false);
  if (!s) return setLastError(cudaErrorMemoryAllocation);
  *pStream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithPriority(pStream, 0, 0); }

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(hStream, &err);
  if (!s) return setLastError(err);
  if (!flags) return setLastError(cudaErrorInvalidValue);
  *flags = s->flags;
  return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(hStream, &err);
  if (!s) return setLastError(err);
  if (!device) return setLastError(cudaErrorInvalidValue);
  *device = s->dev;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return setLastError(cudaErrorInvalidResourceHandle);
  Stream* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    cudaError_t err = cudaSuccess;
    s = resolveStreamLocked(stream, &err);
    if (!s) return setLastError(err);
    if (s->captureId) invalidateLocked(s->captureId, "cudaStreamDestroy of a capturing stream");
    Streams& all = streams();
    all.live.erase(s);
    auto& list = all.byDev[s->dev];
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (*it == s) {
        list.erase(it);
        break;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(s->m);
    s->destroyed = true;  // the worker drains the queue, then ends
  }
  s->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Stream* s = nullptr;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    cudaError_t err = cudaSuccess;
    s = resolveStreamLocked(stream, &err);
    if (!s) return setLastError(err);
    if (cudaError_t e = checkSticky(s->dev)) return e;
    if (s->captureId) {
      invalidateLocked(s->captureId, "cudaStreamSynchronize of " + s->name());
      return setLastError(cudaErrorStreamCaptureUnsupported);
    }
    if (cudaError_t e = legacyImplicitLocked(s)) return e;
    if (s->legacy) {
      // The legacy stream synchronises with the blocking streams: a marker carries those waits.
      Item marker;
      marker.what = "cudaStreamSynchronize";
      marker.delay = false;
      marker.skipWhenLost = false;
      target = submit(s, std::move(marker));
    } else {
      target = submittedOf(s);
    }
  }
  const int timeout = syncTimeoutMs();
  if (!waitDone(s, target, timeout)) {
    return failWhy(cudaErrorTimeout, "cudaStreamSynchronize of " + s->name() + " gave up after " +
                                         std::to_string(timeout) + " ms (CYXWIZ_EMULATED_SYNC_TIMEOUT_MS): "
                                         "its work waits for something that never completes");
  }
  return checkSticky(s->dev);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (s->captureId) {
    invalidateLocked(s->captureId, "cudaStreamQuery of " + s->name());
    return setLastError(cudaErrorStreamCaptureUnsupported);
  }
  if (cudaError_t e = legacyImplicitLocked(s)) return e;
  std::vector<Stream*> check{s};
  if (s->legacy) {
    for (Stream* b : streamsOfLocked(s->dev)) {
      if (b->blocking()) check.push_back(b);
    }
  }
  for (Stream* t : check) {
    std::lock_guard<std::mutex> sl(t->m);
    if (t->done < t->submitted) return setLastError(cudaErrorNotReady);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  const int dev = currentDevice();
  const cudaError_t de = deviceError(dev);
  if (de != cudaSuccess) return setLastError(de == cudaErrorInvalidValue ? cudaErrorNoDevice : de);
  if (cudaError_t e = checkSticky(dev)) return e;
  std::vector<std::pair<Stream*, uint64_t>> targets;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    bool capturing = false;
    for (Stream* s : streamsOfLocked(dev)) {
      if (s->captureId) {
        invalidateLocked(s->captureId, "cudaDeviceSynchronize on cuda:" + std::to_string(dev));
        capturing = true;
      }
    }
    if (capturing) return setLastError(cudaErrorStreamCaptureUnsupported);
    for (Stream* s : streamsOfLocked(dev)) targets.push_back({s, submittedOf(s)});
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(syncTimeoutMs());
  for (const auto& t : targets) {
    if (!waitDone(t.first, t.second, remainingMs(deadline))) {
      return failWhy(cudaErrorTimeout, "cudaDeviceSynchronize on cuda:" + std::to_string(dev) + " gave up: " +
                                           t.first->name() + " waits for something that never completes");
    }
  }
  return checkSticky(dev);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (!fn) return setLastError(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(stream, &err);
  if (!s) return setLastError(err);
  Item item;
  item.what = "cudaLaunchHostFunc";
  item.fn = [fn, userData] { fn(userData); };
  return launchItem(s, std::move(item), false);
}

}  // extern "C"

namespace cxemu {

// Waits (bounded) for every stream of every device: cudaFree and cudaFreeHost synchronise.
bool synchronizeAll(int dev) {
  std::vector<std::pair<Stream*, uint64_t>> targets;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    for (int d = 0; d < kMaxDevices; ++d) {
      if (dev >= 0 && d != dev) continue;
      for (Stream* s : streamsOfLocked(d)) targets.push_back({s, submittedOf(s)});
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(syncTimeoutMs());
  for (const auto& t : targets) {
    if (!waitDone(t.first, t.second, remainingMs(deadline))) return false;
  }
  return true;
}

}  // namespace cxemu
