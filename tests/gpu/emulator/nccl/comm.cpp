// TEST DOUBLE, NOT GPU SUPPORT. The emulated NCCL's communicator lifecycle: unique ids, non-blocking
// init, the asynchronous state, finalize, destroy and abort (see comm.h for the model).
#include "nccl/comm.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "nccl/text.h"
#include "runtime/emu.h"

namespace cxemu::nccl {

namespace {

using Clock = std::chrono::steady_clock;

// The handles' references. Never destroyed (leaked on purpose): at exit, helper threads may still
// run, and a std::thread destroyed while joinable would terminate the process.
struct Registry {
  std::mutex mu;
  std::unordered_map<ncclComm*, CommPtr> live;
  std::string lastError;
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

CommPtr unregister(ncclComm_t handle) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(handle);
  if (it == r.live.end()) return nullptr;
  CommPtr c = std::move(it->second);
  r.live.erase(it);
  return c;
}

// Test hook (cxemu_test_nccl_hold): deferred work waits while set, so a self-test can look at the
// "in progress" state without racing the 1-20 ms deferral on a loaded machine.
std::atomic<bool> held{false};

void helperLoop(ncclComm* c) {
  std::unique_lock<std::mutex> lock(c->mu);
  for (;;) {
    c->cv.wait(lock, [c] { return c->stopHelper || !c->tasks.empty(); });
    if (c->stopHelper) return;
    const Clock::time_point due = c->tasks.front().due;
    if (c->cv.wait_until(lock, due, [c] { return c->stopHelper; })) return;
    while (held.load() && !c->stopHelper) c->cv.wait_for(lock, std::chrono::milliseconds(1));
    if (c->stopHelper) return;
    std::function<void()> run = std::move(c->tasks.front().run);
    c->tasks.pop_front();
    lock.unlock();
    run();  // never under c->mu: it calls into the runtime (cxemu::enqueue)
    lock.lock();
  }
}

// Joins the ranks: opens the shared segment and waits until every rank has joined (no bound of its
// own: a missing peer keeps the init in progress, as in NCCL, until the caller's deadline aborts).
void runInit(const CommPtr& c) {
  if (c->nranks > 1) {
    SharedComm* shared = nullptr;
    const std::string why = SharedComm::open(c->id, c->nranks, c->rank, &shared);
    if (!why.empty()) {
      std::lock_guard<std::mutex> lock(c->mu);
      c->initDone = true;
      setAsyncError(*c, ncclSystemError, cat("emulator: ", why));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->shared.reset(shared);
    }
    std::unique_lock<std::mutex> lock(c->mu);
    while (!c->released && !c->stopHelper && c->shared->joined() < c->nranks) {
      c->cv.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
  std::lock_guard<std::mutex> lock(c->mu);
  c->initDone = true;
  c->cv.notify_all();
}

// Aborted or destroyed: blocked and queued work returns, peers are told, the helper stops. Then waits,
// as NCCL >= 2.26's commDestroySync, until no CUDA graph holds a collective of the communicator.
void release(const CommPtr& c, bool abort, const char* call) {
  bool initOk;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->released = true;
    c->stopHelper = true;
    c->tasks.clear();
    c->deferred = 0;
    initOk = c->initDone && c->error != ncclSystemError;
    c->cv.notify_all();
  }
  if (c->helper.joinable() && c->helper.get_id() != std::this_thread::get_id()) c->helper.join();
  if (c->shared) {
    if (abort) {
      c->shared->abort();
    } else {
      c->shared->leave();
    }
  }
  if (!initOk) return;
  const Clock::time_point start = Clock::now();
  bool told = false;
  for (int held; (held = cxemu::holds(c.get())) > 0;) {
    if (!told && Clock::now() - start > std::chrono::seconds(2)) {
      told = true;
      std::fprintf(stderr,
                   "emulator: %s on cuda:%d waits for %d CUDA graph(s) holding collectives of this NCCL "
                   "communicator to be destroyed (NCCL >= 2.26 polls until they are: destroy the graphs "
                   "first, or this never returns)\n",
                   call, c->dev, held);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

CommPtr lookup(ncclComm_t handle) {
  if (!handle) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(handle);
  return it == r.live.end() ? nullptr : it->second;
}

ncclResult_t fail(ncclResult_t r, const std::string& message) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.lastError = message;
  return r;
}

void setAsyncError(ncclComm& c, ncclResult_t r, const std::string& message) {
  if (c.error == ncclSuccess) c.error = r;
  fail(r, message);
  c.cv.notify_all();
}

ncclResult_t ensureReadyLocked(ncclComm& c, bool inGroup) {
  if (c.error != ncclSuccess) return c.error;
  if (!c.initDone || (c.deferred > 0 && !inGroup) || (c.finalizing && !c.finalized)) {
    return fail(ncclInvalidArgument, "Attempt to use communicator before the previous operation returned ncclSuccess");
  }
  return ncclSuccess;
}

int randomMs(ncclComm& c, int minMs, int maxMs) {
  return std::uniform_int_distribution<int>(minMs, maxMs)(c.rng);
}

void defer(ncclComm& c, int minMs, int maxMs, std::function<void()> task) {
  std::lock_guard<std::mutex> lock(c.mu);
  Clock::time_point due = Clock::now() + std::chrono::milliseconds(randomMs(c, minMs, maxMs));
  if (!c.tasks.empty() && c.tasks.back().due > due) due = c.tasks.back().due;  // in call order
  c.tasks.push_back({due, std::move(task)});
  c.cv.notify_all();
}

void blockUntilReleased(ncclComm& c) {
  std::unique_lock<std::mutex> lock(c.mu);
  c.cv.wait(lock, [&c] { return c.released; });  // the abort path: ncclCommAbort/Destroy
}

}  // namespace cxemu::nccl

ncclComm::~ncclComm() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stopHelper = true;
    cv.notify_all();
  }
  if (helper.joinable()) {
    if (helper.get_id() == std::this_thread::get_id()) {
      helper.detach();
    } else {
      helper.join();
    }
  }
}

namespace cxemu::nccl {

int emulatedVersion() {
  static const int version = [] {
    const char* env = std::getenv("CYXWIZ_EMULATED_NCCL_VERSION");
    if (!env || !*env) return NCCL_VERSION_CODE;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end || v < 20000 || v > NCCL_VERSION_CODE) {
      std::fprintf(stderr, "emulator: CYXWIZ_EMULATED_NCCL_VERSION=%s is not a version code from 20000 to %d "
                           "(2.28.9 is 22809); playing %d\n", env, NCCL_VERSION_CODE, NCCL_VERSION_CODE);
      return NCCL_VERSION_CODE;
    }
    return static_cast<int>(v);
  }();
  return version;
}

}  // namespace cxemu::nccl

using namespace cxemu::nccl;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = emulatedVersion();
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// As NCCL: the process's last message, whatever `comm` (a copy per thread, so that it stays valid).
const char* ncclGetLastError(ncclComm_t) {
  thread_local std::string copy;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  copy = r.lastError;
  return copy.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  const std::string id = makeNcclUniqueId();
  std::memcpy(uniqueId->internal, id.data(), NCCL_UNIQUE_ID_BYTES);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
  *comm = nullptr;
  if (config && config->magic != 0xcafebeef) {
    return fail(ncclInvalidArgument, "ncclCommInitRankConfig: config not initialized with NCCL_CONFIG_INITIALIZER");
  }
  if (nranks < 1) return fail(ncclInvalidArgument, cat("invalid device count (", nranks, ") requested"));
  if (rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, cat("rank ", rank, " exceeds ndev=", nranks));
  const std::string id(commId.internal, NCCL_UNIQUE_ID_BYTES);
  if (!isNcclUniqueId(id)) {
    return fail(ncclInvalidArgument, "emulator: the unique id was not made by ncclGetUniqueId");
  }
  CommPtr c = std::make_shared<ncclComm>();
  c->nranks = nranks;
  c->rank = rank;
  c->dev = cxemu::currentDevice();
  c->id = id;
  c->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  c->rng.seed(static_cast<unsigned>(std::random_device{}()) ^ static_cast<unsigned>(reinterpret_cast<uintptr_t>(c.get())));
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.live[c.get()] = c;
  }
  *comm = c.get();
  if (c->blocking) {
    runInit(c);
    std::lock_guard<std::mutex> lock(c->mu);
    return c->error;
  }
  // Non-blocking: set up in the background, a few ms at least (and until every rank has joined).
  c->helper = std::thread(helperLoop, c.get());
  std::weak_ptr<ncclComm> weak = c;
  defer(*c, 3, 20, [weak] {
    if (CommPtr k = weak.lock()) runInit(k);
  });
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  CommPtr c = lookup(comm);
  if (!c) return fail(ncclInvalidArgument, "emulator: ncclCommGetAsyncError of a communicator that is not live");
  std::unique_lock<std::mutex> lock(c->mu);
  if (c->error != ncclSuccess) {
    *asyncError = c->error;
  } else if (!c->initDone || c->deferred > 0) {
    *asyncError = ncclInProgress;
  } else if (c->finalizing && !c->finalized) {
    *asyncError = ncclInProgress;
    if (c->inFlight == 0) {
      lock.unlock();  // never call into the runtime under c->mu
      const int held = cxemu::holds(c.get());
      lock.lock();
      if (held == 0 && c->inFlight == 0) c->finalized = true;
      if (c->finalized) *asyncError = ncclSuccess;
    }
  } else {
    *asyncError = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  CommPtr c = lookup(comm);
  if (!c) return fail(ncclInvalidArgument, "emulator: ncclCommFinalize of a communicator that is not live");
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (ncclResult_t r = ensureReadyLocked(*c, false); r != ncclSuccess) return r;
    if (c->finalizing) return fail(ncclInvalidUsage, "emulator: ncclCommFinalize called twice");
    c->finalizing = true;
  }
  if (!c->blocking) return ncclInProgress;  // completes once its work is done and no graph holds it
  for (ncclResult_t st = ncclInProgress; st == ncclInProgress;) {
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return ncclInternalError;
    if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ncclSuccess;
}

// Frees the communicator; without a completed finalize, as NCCL does, it first waits until no graph
// holds it. Peers waiting for this rank stop with a remote error.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  CommPtr c = unregister(comm);
  if (!c) {
    std::fprintf(stderr, "emulator: ncclCommDestroy of a communicator that is not live (destroyed or aborted "
                         "already?); ignored\n");
    return fail(ncclInvalidArgument, "emulator: ncclCommDestroy of a communicator that is not live");
  }
  release(c, false, "ncclCommDestroy");
  return ncclSuccess;
}

// NCCL's abort: uncompleted operations are aborted (blocked work returns), resources freed; it joins a
// finalize still in progress, which waits until the graphs holding the communicator are destroyed.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  CommPtr c = unregister(comm);
  if (!c) {
    std::fprintf(stderr, "emulator: ncclCommAbort of a communicator that is not live; ignored\n");
    return fail(ncclInvalidArgument, "emulator: ncclCommAbort of a communicator that is not live");
  }
  release(c, true, "ncclCommAbort");
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  CommPtr c = lookup(comm);
  if (!c || !count) return fail(ncclInvalidArgument, "ncclCommCount: invalid communicator or count");
  std::lock_guard<std::mutex> lock(c->mu);
  if (ncclResult_t r = ensureReadyLocked(*c, groupDepth() > 0); r != ncclSuccess) return r;
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  CommPtr c = lookup(comm);
  if (!c || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: invalid communicator or device");
  std::lock_guard<std::mutex> lock(c->mu);
  if (ncclResult_t r = ensureReadyLocked(*c, groupDepth() > 0); r != ncclSuccess) return r;
  *device = c->dev;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  CommPtr c = lookup(comm);
  if (!c || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: invalid communicator or rank");
  std::lock_guard<std::mutex> lock(c->mu);
  if (ncclResult_t r = ensureReadyLocked(*c, groupDepth() > 0); r != ncclSuccess) return r;
  *rank = c->rank;
  return ncclSuccess;
}

}  // extern "C"

extern "C" __attribute__((visibility("default"))) void cxemu_test_nccl_hold(int on) { cxemu::nccl::held.store(on != 0); }
