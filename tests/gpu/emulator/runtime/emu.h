// TEST DOUBLE, NOT GPU SUPPORT. The internal interface of the emulated CUDA runtime
// (tests/gpu/emulator/runtime/*.cpp), used by the emulated cuBLAS, NCCL and kernel launches. The
// public side is the CUDA runtime API subset declared in tests/gpu/emulator/include/.
//
// Model: every stream is a worker thread that runs its queued work in order, asynchronously from the
// host. Device memory is host memory in a registry (device, size, live/freed, who freed it). Work
// declares the ranges it touches; they are checked when the work runs, so a buffer freed on one
// stream while work queued on another still reads it is caught.
#pragma once

#include <cuda_runtime_api.h>  // the emulator's own, tests/gpu/emulator/include

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cxemu {

// One range of memory that a piece of queued work reads or writes.
struct Access {
  const void* ptr;
  size_t bytes;
  bool write;
};

// Enqueues `work` on `stream` (nullptr: the legacy default stream of the calling thread's current
// device) as a launch named `what` (a kernel name, "cublasSgemm", "ncclAllReduce"...). Behaves as a
// <<<>>> launch: the error (if any) is returned and also set as the calling thread's last error.
// While `stream` is being captured the work is recorded into the graph instead, and runs at each
// replay. When the work runs, on the stream's worker, every Access is checked first: it must lie
// within one live device allocation, pinned host buffer, or registered foreign allocation. A range
// that was freed (or never allocated) makes a sticky cudaErrorIllegalAddress and prints to stderr
// "emulator: <what> on cuda:<dev> touched <ptr> (<bytes> bytes) <freed by cudaFreeAsync on stream
// ... | outside any allocation>"; the work is then skipped (as is all later work: the context is lost).
cudaError_t enqueue(cudaStream_t stream, const char* what, std::vector<Access> accesses,
                    std::function<void()> work);

// Host-side checks at enqueue time (argument validation the real library does synchronously):
// whether [ptr, ptr+bytes) lies in one live device allocation (any device when dev < 0).
bool isDeviceRange(const void* ptr, size_t bytes, int dev);

int currentDevice();                   // the calling thread's device (cudaSetDevice), 0 by default
int streamDevice(cudaStream_t stream);  // the device a stream belongs to
bool isCapturing(cudaStream_t stream);
// Whether the work currently executing on this worker thread is part of a graph replay (for NCCL's
// "graphs holding a communicator's collectives" bookkeeping, see graphAddHold below).
// A capture that records a collective of `owner` (an ncclComm_t) calls this so that the graph that
// the capture becomes holds `owner` until it is destroyed: holds(owner) counts live graph execs
// (and captured graphs) that hold it.
void captureAddHold(cudaStream_t stream, void* owner);
int holds(void* owner);

// Sets the calling thread's last error (not sticky) and returns `e`, for the emulated libraries'
// entry points that report through the runtime's error state.
cudaError_t setLastError(cudaError_t e);

// The environment knobs, read once: CYXWIZ_EMULATED_GPUS (default 1, 0..64).
int deviceCountSetting(bool* valid);

// ---- added by the runtime (additive) ----

// Whether the work running on the calling worker thread is part of a graph replay.
bool inReplay();
// Prints "emulator: <line>" on stderr, in one write.
void say(const std::string& line);
// The sticky error of `dev`: cudaSuccess while its context is healthy.
cudaError_t stickyError(int dev);
// For work that detects a fault itself (an index out of range it would read on a GPU): marks the
// context of `dev` lost with `e` (cudaErrorIllegalAddress, cudaErrorAssert...), prints `why` as an
// "emulator:" line and counts it (cxemu_test_errors, for cudaErrorIllegalAddress). Later work on `dev`
// is skipped and every later runtime call on it returns `e`.
void loseContext(int dev, cudaError_t e, const std::string& why);
// Whether [ptr, ptr+bytes) lies in one live pinned (cudaMallocHost) buffer.
bool isPinnedRange(const void* ptr, size_t bytes);

}  // namespace cxemu
