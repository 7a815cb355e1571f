// TEST DOUBLE, NOT GPU SUPPORT. What the emulated runtime's files share among themselves (emu.h is
// the interface for the other emulated libraries). Every global object here is created on first use
// and never destroyed: stream workers are detached threads that may still run (or wait) while the
// process exits, so nothing they touch may be torn down by static destructors.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "emu.h"

namespace cxemu {

constexpr int kMaxDevices = 64;

// ---- errors.cpp ----

// (say, stickyError and loseContext: emu.h.)
int illegalAccessCount();
// Returns the sticky error of `dev` (setting it as the thread's last error) or cudaSuccess.
cudaError_t checkSticky(int dev);
// fail() with a stderr line saying why.
cudaError_t failWhy(cudaError_t e, const std::string& why);
std::string hexPtr(const void* p);

// ---- devices.cpp ----

int deviceCount();  // 0 when CYXWIZ_EMULATED_GPUS is invalid
// cudaSuccess, or the error a call taking `dev` returns (without setting it).
cudaError_t deviceError(int dev);
int envInt(const char* name, int fallback, int lo, int hi);  // read each call
int syncTimeoutMs();     // CYXWIZ_EMULATED_SYNC_TIMEOUT_MS, default 120000
int maxDelayUs();        // CYXWIZ_EMULATED_DELAY_US, default 2000 (0 disables the random delay)

// ---- registry.cpp: every allocation the emulated device can touch ----

enum class BlockKind { Device, Pinned, Foreign, Graph };
enum class BlockState {
  Pending,   // cudaMallocAsync whose stream has not reached the allocation yet
  Live,
  Freed,     // poisoned, in quarantine (never reused while there)
  Reserved,  // graph memory outside its alloc..free span of a replay
};
enum class PoolKind { None, Default, Created };

struct BlockInfo {
  uintptr_t base = 0;
  size_t bytes = 0;
  int dev = -1;
  BlockKind kind = BlockKind::Device;
  BlockState state = BlockState::Live;
  bool freeQueued = false;  // a cudaFreeAsync is on its way
  PoolKind pool = PoolKind::None;
  void* poolHandle = nullptr;
  std::string note;  // who freed it / who allocated it (for messages)
};

// Allocates `bytes` of host memory (256-aligned, filled with 0xFF) and registers it. nullptr: out of
// host memory.
void* blockCreate(size_t bytes, int dev, BlockKind kind, BlockState state, PoolKind pool, void* poolHandle,
                  const std::string& note);
// The block whose base is exactly `p`.
bool blockAt(const void* p, BlockInfo* out);
// The block containing `p` (any state).
bool blockContaining(const void* p, BlockInfo* out);
// Sets the state of the block at `base`; Freed/Reserved poison it (0xFF), Live from Reserved too.
// Freed blocks enter the quarantine. Returns false if there is no such block.
bool blockSetState(const void* base, BlockState state, const std::string& note);
bool blockSetFreeQueued(const void* base, bool queued);
bool blockSetKind(const void* base, BlockKind kind);
// Whether a live (or pending) block of kind Device/Foreign/Graph holds [p, p+bytes) (dev < 0: any).
bool deviceRange(const void* p, size_t bytes, int dev, bool pendingCounts);
// The check of one Access when work runs on `dev`: the range lies in one live device block of `dev`
// (any device when `peer`), or one live pinned block. Otherwise fills `why`.
bool accessOk(const Access& a, int dev, bool peer, std::string* why);
size_t liveBytes(int dev, void* poolHandle);

// ---- streams.cpp ----

struct Stream;

struct Dep {
  Stream* stream;
  uint64_t seq;  // done when stream->done >= seq
};

// One piece of stream-ordered work.
struct Item {
  std::string what;
  std::vector<Access> accesses;
  bool peer = false;        // copies may touch any device's memory
  bool delay = true;        // bookkeeping (markers, waits) runs without the random delay
  bool skipWhenLost = true;  // kernels do not run once the context is lost; bookkeeping still does
  std::vector<Dep> deps;    // waits (events, the legacy stream's implicit ordering)
  std::function<void()> fn;
};

struct Stream {
  int dev = 0;
  unsigned flags = 0;
  int serial = 0;  // for messages: "stream 3 of cuda:0"
  bool legacy = false;
  bool perThread = false;
  std::mutex m;
  std::condition_variable cv;
  std::deque<Item> queue;
  uint64_t submitted = 0;  // guarded by m
  uint64_t done = 0;       // guarded by m
  bool destroyed = false;  // guarded by m
  std::mt19937 rng;        // the worker's only
  // Capture (guarded by stateMutex()).
  uint64_t captureId = 0;
  std::vector<int> tail;  // the capture's nodes this stream's next node depends on
  bool blocking() const { return !legacy && !(flags & cudaStreamNonBlocking); }
  std::string name() const;
};

// Guards the stream registry, the captures, events and graphs (never taken by a worker while it holds
// a stream's mutex).
std::mutex& stateMutex();

// The stream a handle names (nullptr/cudaStreamLegacy/cudaStreamPerThread resolve for the calling
// thread's current device). nullptr with *err set when it is not a live stream. Locks stateMutex.
Stream* resolveStream(cudaStream_t h, cudaError_t* err);
Stream* resolveStreamLocked(cudaStream_t h, cudaError_t* err);
Stream* legacyStreamLocked(int dev);
std::vector<Stream*> streamsOfLocked(int dev);
// Appends `item` (with the legacy stream's implicit ordering); returns its sequence number.
uint64_t submit(Stream* s, Item item);
// Waits until s->done >= seq; false after `timeoutMs` (< 0: no timeout).
bool waitDone(Stream* s, uint64_t seq, int timeoutMs);
uint64_t submittedOf(Stream* s);
// Runs one item's checks and work (on a worker, or inside a replay).
void execute(int dev, Item& item, const char* context);
// A stream-ordered operation: sticky check, capture (recorded as a node, or refused) or submit.
// `kernel`: a launch, which must be on a stream of the current device.
cudaError_t launchItem(Stream* s, Item item, bool kernel);
// An operation on the legacy stream while a blocking stream of its device captures: refused with
// cudaErrorStreamCaptureImplicit (set as last error), those captures invalidated. stateMutex held.
cudaError_t legacyImplicitLocked(Stream* s);
// Waits (bounded by the sync timeout) for all work submitted so far to the streams of `dev` (every
// device when dev < 0). false on timeout.
bool synchronizeAll(int dev);

// ---- capture.cpp ----

// Called with stateMutex held by launchItem for a stream in a capture: records the node (or returns
// the capture's error).
cudaError_t captureRecordLocked(Stream* s, Item& item);
// Invalidates the capture (with its first reason); stateMutex held.
void invalidateLocked(uint64_t captureId, const std::string& why);
bool captureActiveLocked(uint64_t id);
bool captureInvalidatedLocked(uint64_t id);
// The capture that forbids a potentially unsafe call (cudaMalloc...) from this thread, or 0.
uint64_t unsafeCallCaptureLocked();
// cudaMallocAsync/cudaFreeAsync in a capture (stateMutex held).
cudaError_t captureAllocLocked(Stream* s, size_t bytes, void** out);
cudaError_t captureFreeLocked(Stream* s, void* ptr);
// The capture's snapshot of a stream's dependencies, for events recorded in it.
std::vector<int> captureTailLocked(Stream* s);
cudaError_t captureJoinLocked(Stream* s, uint64_t captureId, const std::vector<int>& tail);

// ---- blas.cpp ----

// cuBLAS's column-major C = alpha op(A) op(B) + beta C, float accumulation in k order; beta == 0 does
// not read C. `tf32` rounds the inputs to TF32 first, as tensor cores do.
void gemmHost(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, const float* c, int64_t ldc, float* d, int64_t ldd, bool tf32);
// Bytes a column-major rows x cols matrix with leading dimension ld spans (0 if empty).
size_t matrixBytes(int64_t rows, int64_t cols, int64_t ld);

}  // namespace cxemu
