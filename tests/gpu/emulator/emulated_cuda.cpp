// TEST DOUBLE, NOT GPU SUPPORT. A host-memory emulation of the ABI of libcyxwiz_cuda.so
// (cyxwiz/cuda/api.h), loaded by the engine through CYXWIZ_CUDA_LIBRARY so that its GPU plumbing
// (device tensors, model.to, the GPU branches of layers/losses/optimizers, DDP device buckets, the
// NCCL backend with one rank or with rank processes of one machine, pinned staging, CUDA graph
// capture, collectives in a graph) runs in CI on machines without a GPU. It says nothing about the
// real CUDA kernels, cuBLAS or NCCL; never ship it or present it as GPU support.
//
// Its point is to be stricter than a GPU where the engine can go wrong unnoticed:
//   - "device memory" is host memory in an allocation registry; every device pointer argument must lie,
//     with the whole range the method touches, inside a live allocation of that `dev` (a view at an
//     offset is fine), and every host argument must not be one: host/device mix-ups, stale pointers,
//     wrong devices and short buffers return an error Status ("emulator: gemm got a host pointer as
//     device argument a") instead of corrupting memory or silently working;
//   - fresh allocations are filled with 0xFF bytes (a NaN as float32, -1 as integers), so code that
//     forgets to initialise device memory produces NaNs;
//   - copies must match their CopyKind; events and communicators are checked against live handles;
//   - graph capture records each stream-ordered call (checked at once, and again at each replay) and
//     refuses what CUDA refuses in a capture (host copies, synchronize, queries of captured events...).
// The arithmetic (emulated_kernels.cpp) follows the CUDA kernels of cyxwiz/cuda/*.cu; collectives
// between processes go through shared memory (emulated_nccl.cpp). Everything runs synchronously on the
// calling thread; a captured call runs at each graphLaunch instead. See README.md beside this file.
//
// Environment: CYXWIZ_EMULATED_GPUS (device count, default 1, read once when the library is first
// used); CYXWIZ_EMULATED_NCCL_HANG=1 (read each time a collective runs, a replayed one included: the
// collective never completes until its communicator is aborted or destroyed, for the engine's
// timeout/abort path); CYXWIZ_EMULATED_CAPTURE_FAIL=1 (read at each graphEndCapture: instantiating
// the graph fails, as on a runtime that refuses something in it, for the engine's fallback to eager
// steps); DISTRIBUTED_TIMEOUT_MS (the engine's, read at each ncclInit of several ranks, 30 s when
// unset: how long a collective waits for its peers before it hangs).
//
// Build, from the repository root (nothing but the C++ standard library):
//   g++ -std=c++17 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Icpp
//       tests/gpu/emulator/*.cpp -o OUT/libcyxwiz_cuda_emulated.so
// Only cyxwiz_cuda_api is exported: the messages are built with cat() (emulated_text.h) rather than
// std::to_string and std::string's operator+, no type here is a std:: template over std:: types only
// (no std::function<Status()>, std::shared_ptr, std::vector<char*>), and the mutex is pthread's rather
// than std::mutex, because libstdc++ gives such inline functions default visibility despite
// -fvisibility=hidden whenever GCC does not inline them (at -O0 some still show up as weak symbols:
// harmless under RTLD_LOCAL). Check with nm -D --defined-only after a change.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cyxwiz/cuda/api.h"
#include "emulated_kernels.h"
#include "emulated_nccl.h"
#include "emulated_text.h"

namespace cyxwiz::cuda {

namespace {

constexpr int kMaxDevices = 64;           // as state.cpp
constexpr size_t kDeviceAlignment = 256;  // as cudaMalloc
constexpr size_t kHostAlignment = 64;
using emulated::elemBytes;
using emulated::kNcclUniqueIdBytes;

// ---- messages ----

using emulated::cat;  // emulated_text.h

std::string cudaDev(int dev) { return cat("cuda:", dev); }

void warn(const char* message) {
  std::fprintf(stderr, "pycyxwiz CUDA emulator: %s\n", message);
  std::fflush(stderr);
}
void warn(const std::string& message) { warn(message.c_str()); }

// A CUDA runtime error: cudaGetErrorString's text and cudaGetErrorName's name.
struct CudaErr {
  const char* text;
  const char* name;
};
constexpr CudaErr kInvalidDevice{"invalid device ordinal", "cudaErrorInvalidDevice"};
constexpr CudaErr kNoDevice{"no CUDA-capable device is detected", "cudaErrorNoDevice"};
constexpr CudaErr kOutOfMemory{"out of memory", "cudaErrorMemoryAllocation"};
constexpr CudaErr kInvalidHandle{"invalid resource handle", "cudaErrorInvalidResourceHandle"};
constexpr CudaErr kInvalidValue{"invalid argument", "cudaErrorInvalidValue"};
constexpr CudaErr kIllegalState{"the operation cannot be performed in the present state", "cudaErrorIllegalState"};
// The stream-capture errors.
constexpr CudaErr kCaptureUnsupported{"operation not permitted when stream is capturing",
                                      "cudaErrorStreamCaptureUnsupported"};
constexpr CudaErr kCaptureInvalidated{"operation failed due to a previous error during capture",
                                      "cudaErrorStreamCaptureInvalidated"};
constexpr CudaErr kCaptureMerge{"operation would result in a merge of separate capture sequences",
                                "cudaErrorStreamCaptureMerge"};
constexpr CudaErr kCaptureUnjoined{"capturing stream has unjoined work", "cudaErrorStreamCaptureUnjoined"};
constexpr CudaErr kCaptureIsolation{"dependency created on uncaptured work in another stream",
                                    "cudaErrorStreamCaptureIsolation"};
constexpr CudaErr kCapturedEvent{"operation not permitted on an event last recorded in a capturing stream",
                                 "cudaErrorCapturedEvent"};

// "cudaSetDevice on cuda:5 failed: invalid device ordinal (cudaErrorInvalidDevice)", as errors.h.
Status cudaError(const char* call, int dev, CudaErr e) {
  if (dev < 0) return cat(call, " failed: ", e.text, " (", e.name, ")");
  return cat(call, " on cuda:", dev, " failed: ", e.text, " (", e.name, ")");
}

#define EMU_TRY(expr)                       \
  do {                                      \
    ::cyxwiz::cuda::Status emu_s_ = (expr); \
    if (!emu_s_.empty()) return emu_s_;     \
  } while (0)

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// std::mutex's inline lock() is exported when GCC does not inline it (see the top of the file).
class Mutex {
 public:
  void lock() { pthread_mutex_lock(&m_); }
  void unlock() { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_ = PTHREAD_MUTEX_INITIALIZER;
};
using Lock = std::lock_guard<Mutex>;
size_t f32(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
size_t i64(int64_t n) { return static_cast<size_t>(n) * sizeof(int64_t); }

// ---- handles ----

struct Comm {
  uint64_t id = 0;  // never reused
  int dev = -1;
  int nranks = 0;
  int rank = 0;
  bool aborted = false;
  // nranks > 1: the shared-memory transport (emulated_nccl.h); null once aborted and idle.
  std::unique_ptr<emulated::SharedComm> shared;
  Status error;           // the asynchronous error ncclState reports (a peer gone, mismatched collectives)
  int busy = 0;           // collectives exchanging in some thread right now (outside the lock)
  bool destroyed = false;  // ncclDestroy came while busy: the last exchange deletes it
};

enum class Stream { Compute, Comm };

// A point on a stream: the communicator whose hung collective (CYXWIZ_EMULATED_NCCL_HANG, peers that
// did not come, a failed communicator) the point waits behind, 0 when none.
struct Mark {
  uint64_t blockedBy = 0;
};

struct Event {
  int dev = -1;
  Stream stream = Stream::Comm;
  uint64_t capture = 0;      // the serial of the capture it was recorded in; 0: recorded outside any
  uint64_t collectives = 0;  // recorded in a capture: how many collectives that capture held before it
  Mark own;
  // &own; for an event recorded in a capture, a Mark of the capture (then of its graph), which each
  // replay sets: the graph's nodes use it after the event is released, as a real graph keeps the
  // edges made of events. Read outside those nodes only when capture == 0.
  Mark* mark = &own;
};

struct Alloc {
  int dev;  // -1: pinned host memory
  size_t size;
  uint64_t capture = 0;  // graph-owned: the serial of the capture that allocated it; 0: an ordinary block
};

struct Found {
  const char* base = nullptr;
  Alloc alloc{-1, 0};
};

// ---- graphs ----

// A closure run now or at each replay (a std::function<Status()> would be exported: see the top).
class Step {
 public:
  Step() = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Step>>>
  Step(F f) : fn_(new Of<F>(std::move(f))) {}  // NOLINT: implicit, so that a lambda converts
  explicit operator bool() const { return fn_ != nullptr; }
  Status operator()() const { return fn_->call(); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual Status call() const = 0;
  };
  template <class F>
  struct Of final : Base {
    explicit Of(F f) : f(std::move(f)) {}
    Status call() const override { return f(); }
    F f;
  };
  std::unique_ptr<Base> fn_;
};

// One stream-ordered call recorded by a capture. `check` validates its arguments (every device range
// inside a live allocation...): it ran when the call was made and runs again before each replay of the
// node, because the engine must keep the memory a graph uses alive for the graph's life. `body` is the
// kernel, reading its inputs (the optimizers' device scalars included) when it runs.
struct Node {
  const char* name;
  Step check;  // may be empty
  Step body;
};

// A block malloc'ed during a capture: graph memory, reserved (never returned to the host heap) until
// the graph is destroyed, live (in allocs_) only between its malloc and free nodes of a replay.
struct Block {
  char* base;
  size_t size;
  bool freed;  // freed during the capture
};

// A capture in progress on one device.
struct Capture {
  uint64_t serial = 0;  // never reused
  Status invalidated;   // the first call that invalidated it; empty: still valid
  std::vector<Node> nodes;
  std::vector<Block> blocks;
  std::vector<std::unique_ptr<Mark>> marks;  // of the events recorded in the capture
  bool commJoined = false;   // the communication stream waited for the compute stream: it records too
  uint64_t collectives = 0;  // collectives recorded on the communication stream
  uint64_t joined = 0;       // how many of them the compute stream has waited for (computeWaitsFor)
};

// What graphEndCapture returns (the opaque graphExec).
struct Graph {
  uint64_t serial = 0;
  int dev = -1;
  std::vector<Node> nodes;
  std::vector<Block> blocks;
  std::vector<std::unique_ptr<Mark>> marks;
};

class EmulatedApi final : public Api {
 public:
  EmulatedApi() { readDeviceCount(); }

  int apiVersion() const noexcept override { return kApiVersion; }
  int cudaRuntimeVersion() const noexcept override { return 13000; }
  int ncclVersion() const noexcept override { return 23203; }
  int cublasVersion() const noexcept override { return 131000; }
  const char* architectures() const noexcept override { return "emulated"; }

  // ---- devices ----

  Status deviceCount(int* count) noexcept override {
    *count = 0;
    if (!countError_.empty()) return countError_;
    *count = count_;
    return {};
  }

  Status driverVersion(int* version) noexcept override {
    *version = 13000;
    return {};
  }

  Status deviceProperties(int dev, DeviceProperties* out) noexcept override {
    if (dev < 0 || dev >= count_) return invalidDevice("cudaGetDeviceProperties", dev);
    out->name = "pycyxwiz host emulator";
    out->major = 9;
    out->minor = 0;
    out->totalMemory = size_t(80) << 30;
    out->multiProcessors = 132;
    return {};
  }

  // Interior pointers (views) too, as cudaPointerGetAttributes; pinned host memory is -1.
  Status pointerDevice(const void* ptr, int* dev) noexcept override {
    *dev = -1;
    if (!ptr) return {};
    Found f;
    if (lookup(ptr, &f)) *dev = f.alloc.dev;
    return {};
  }

  // ---- memory ----

  // While dev is capturing, the block is graph memory (a graph's memory node): its address is fixed for
  // the graph's life, it must be freed in the same capture, and each replay hands it out fresh (NaN).
  Status malloc(int dev, size_t bytes, void** out) noexcept override {
    *out = nullptr;
    EMU_TRY(useDevice(dev));
    if (bytes == 0) return {};
    const size_t padded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
    void* p = padded >= bytes ? std::aligned_alloc(kDeviceAlignment, padded) : nullptr;
    if (!p) return cudaError("cudaMallocAsync", dev, kOutOfMemory);
    std::memset(p, 0xFF, padded);  // NaN as float32: uninitialised device memory shows
    Lock lock(mutex_);
    Capture* c = capture_[dev].get();
    allocs_[addr(p)] = Alloc{dev, bytes, c ? c->serial : 0};
    if (c) {
      c->blocks.push_back(Block{static_cast<char*>(p), bytes, false});
      c->nodes.push_back(Node{"malloc", {}, [this, p, dev, bytes, serial = c->serial]() -> Status {
                                std::memset(p, 0xFF, bytes);  // fresh memory at each replay
                                Lock lock(mutex_);
                                allocs_[addr(p)] = Alloc{dev, bytes, serial};
                                return {};
                              }});
    }
    *out = p;
    return {};
  }

  void free(int dev, void* ptr) noexcept override {
    if (!ptr) return;
    Alloc a{-1, 0};
    {
      Lock lock(mutex_);
      auto it = allocs_.find(addr(ptr));
      if (it == allocs_.end()) {
        // Errors are ignored by the contract; say it on stderr: a double free or a foreign pointer. A
        // block allocated in a capture ends up here too once the capture is over: the graph owns it.
        warn(cat("free on ", cudaDev(dev), " of a pointer that is not a live device allocation (double free, an "
                 "interior pointer, host memory, or graph memory of a finished capture); ignored"));
        return;
      }
      a = it->second;
      Capture* c = dev >= 0 && dev < kMaxDevices ? capture_[dev].get() : nullptr;
      if (a.capture != 0) {
        if (c && c->serial == a.capture) {
          freeInCapture(*c, it);
        } else {
          warn(cat("free on ", cudaDev(dev), " of graph memory of ", cudaDev(a.dev),
                   " outside the capture (or replay) that owns it; ignored"));
        }
        return;
      }
      if (c) {
        // A free node of memory from outside the graph would free it at the first replay and then
        // again at each later one: the engine must never do it.
        const std::string what = cat("free on ", cudaDev(dev), " while it is capturing a graph, of ", a.size,
                                     " bytes allocated outside the capture: a graph may free only memory it "
                                     "allocated; ignored, and the capture is invalidated");
        warn(what);
        invalidate(*c, cat("emulator: ", what));
        return;
      }
      allocs_.erase(it);
    }
    if (a.dev != dev) warn(cat("free on ", cudaDev(dev), " of memory allocated on ", cudaDev(a.dev)));
    std::free(ptr);
  }

  Status mallocHost(size_t bytes, void** out) noexcept override {
    *out = nullptr;
    if (bytes == 0) return {};
    const size_t padded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = padded >= bytes ? std::aligned_alloc(kHostAlignment, padded) : nullptr;
    if (!p) return cudaError("cudaMallocHost", -1, kOutOfMemory);
    Lock lock(mutex_);
    pinned_[addr(p)] = Alloc{-1, bytes};  // not device memory: never looked up
    *out = p;
    return {};
  }

  void freeHost(void* ptr) noexcept override {
    if (!ptr) return;
    {
      Lock lock(mutex_);
      if (!pinned_.erase(addr(ptr))) {
        warn("freeHost of a pointer that mallocHost did not return (or freed twice); ignored");
        return;
      }
    }
    std::free(ptr);
  }

  Status copy(int dev, void* dst, const void* src, size_t bytes, CopyKind kind) noexcept override {
    EMU_TRY(useDevice(dev));
    if (bytes == 0) return {};
    switch (kind) {
      case CopyKind::HostToDevice:
      case CopyKind::DeviceToHost: {
        const bool toDevice = kind == CopyKind::HostToDevice;
        const char* who = toDevice ? "copy HostToDevice" : "copy DeviceToHost";
        // The host reads or writes the bytes around the call, once: nothing a replay could repeat (api.h).
        EMU_TRY(refuseWhileCapturing(dev, "cudaMemcpyAsync", kCaptureUnsupported, who));
        EMU_TRY(deviceArg(who, dev, toDevice ? dst : src, bytes, toDevice ? "dst" : "src"));
        EMU_TRY(hostArg(who, toDevice ? src : dst, toDevice ? "src" : "dst"));
        std::memmove(dst, src, bytes);
        return {};
      }
      case CopyKind::DeviceToDevice:
        return run(dev, "copy DeviceToDevice", [=]() { return peerCopyCheck(dev, dst, src, bytes); },
                   [=]() -> Status {
                     std::memmove(dst, src, bytes);
                     return {};
                   });
    }
    return cat("copy on ", cudaDev(dev), ": unknown CopyKind ", int(kind));
  }

  Status memsetZero(int dev, void* dst, size_t bytes) noexcept override {
    EMU_TRY(useDevice(dev));
    if (bytes == 0) return {};
    return run(dev, "memsetZero", [=]() { return deviceArg("memsetZero", dev, dst, bytes, "dst"); },
               [=]() -> Status {
                 std::memset(dst, 0, bytes);
                 return {};
               });
  }

  Status fill(int dev, float* dst, int64_t n, float value) noexcept override {
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    return run(dev, "fill", [=]() { return deviceArg("fill", dev, dst, f32(n), "dst"); },
               [=]() -> Status {
                 std::fill(dst, dst + n, value);
                 return {};
               });
  }

  Status synchronize(int dev) noexcept override {
    EMU_TRY(useDevice(dev));
    EMU_TRY(refuseWhileCapturing(dev, "cudaStreamSynchronize", kCaptureUnsupported, "synchronize"));
    Lock lock(mutex_);
    if (liveBlock(computeBlocked_[dev])) {
      return cat("emulator: synchronize on ", cudaDev(dev), " would never return: its compute stream waits "
                 "(computeWaitsFor) for a collective that hangs (CYXWIZ_EMULATED_NCCL_HANG=1, peers that did not "
                 "come, or a failed communicator) until its communicator is aborted");
    }
    return {};
  }

  Status query(int dev, bool* done) noexcept override {
    *done = false;
    EMU_TRY(useDevice(dev));
    EMU_TRY(refuseWhileCapturing(dev, "cudaStreamQuery", kCaptureUnsupported, "query"));
    Lock lock(mutex_);
    *done = liveBlock(computeBlocked_[dev]) == 0;
    return {};
  }

  // ---- math (the kernels are in emulated_kernels.cpp) ----

  // Stored only: the emulated GEMM is always full precision.
  void setTF32(bool enabled) noexcept override { tf32_.store(enabled, std::memory_order_relaxed); }

  Status gemm(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) noexcept override {
    EMU_TRY(useDevice(dev));
    if (m <= 0 || n <= 0) return {};
    return run(dev, "gemm", [=]() { return gemmCheck(dev, transA, transB, m, n, k, a, lda, b, ldb, beta, c, ldc); },
               [=]() -> Status {
                 emulated::gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
                 return {};
               });
  }

  Status broadcastRows(int dev, const float* row, float* out, int64_t rows, int64_t cols) noexcept override {
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    return run(dev, "broadcastRows", [=]() { return broadcastRowsCheck(dev, row, out, rows, cols); },
               [=]() -> Status {
                 emulated::broadcastRows(row, out, rows, cols);
                 return {};
               });
  }

  Status addColumnSums(int dev, const float* g, float* out, int64_t rows, int64_t cols) noexcept override {
    const char* M = "addColumnSums";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, g, f32(rows * cols), "g"));
          return deviceArg(M, dev, out, f32(cols), "out");
        },
        [=]() -> Status {
          emulated::addColumnSums(g, out, rows, cols);
          return {};
        });
  }

  // As the library's fallback path: bias broadcast, GEMM onto it, ReLU in place. (The cuBLASLt
  // epilogue computes the same up to the GEMM's float32 rounding.)
  Status linearForward(int dev, const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                       int64_t out, bool relu) noexcept override {
    const char* M = "linearForward";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || out <= 0) return {};
    const float beta = bias ? 1.0f : 0.0f;
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, y, f32(rows * out), "y"));
          if (bias) EMU_TRY(broadcastRowsCheck(dev, bias, y, rows, out));
          return gemmCheck(dev, false, true, rows, out, in, x, in, w, in, beta, y, out);
        },
        [=]() -> Status {
          if (bias) emulated::broadcastRows(bias, y, rows, out);
          emulated::gemm(false, true, rows, out, in, 1.0f, x, in, w, in, beta, y, out);
          if (relu) emulated::reluInPlace(y, rows * out);
          return {};
        });
  }

  Status activationForward(int dev, Activation f, const float* x, float* y, int64_t n) noexcept override {
    const char* M = "activationForward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    if (!emulated::knownActivation(f)) return unknownActivation(M, dev, f);
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, x, f32(n), "x"));
          return deviceArg(M, dev, y, f32(n), "y");
        },
        [=]() -> Status {
          emulated::activationForward(f, x, y, n);
          return {};
        });
  }

  Status activationBackward(int dev, Activation f, const float* x, const float* g, float* dx,
                            int64_t n) noexcept override {
    const char* M = "activationBackward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    if (!emulated::knownActivation(f)) return unknownActivation(M, dev, f);
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, x, f32(n), "x"));
          EMU_TRY(deviceArg(M, dev, g, f32(n), "g"));
          return deviceArg(M, dev, dx, f32(n), "dx");
        },
        [=]() -> Status {
          emulated::activationBackward(f, x, g, dx, n);
          return {};
        });
  }

  Status multiply(int dev, const float* a, const float* b, float* out, int64_t n) noexcept override {
    const char* M = "multiply";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, a, f32(n), "a"));
          EMU_TRY(deviceArg(M, dev, b, f32(n), "b"));
          return deviceArg(M, dev, out, f32(n), "out");
        },
        [=]() -> Status {
          emulated::multiply(a, b, out, n);
          return {};
        });
  }

  Status dropoutForward(int dev, const float* x, float* y, float* mask, int64_t n, float keep, uint64_t seed,
                        const uint64_t* seedOnDevice) noexcept override {
    const char* M = "dropoutForward";
    if (!(keep > 0.0f && keep <= 1.0f)) {
      return cat("dropoutForward on ", cudaDev(dev), ": keep probability ", keep, " is outside (0, 1]");
    }
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, x, f32(n), "x"));
          EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
          if (seedOnDevice) EMU_TRY(deviceArg(M, dev, seedOnDevice, sizeof(uint64_t), "seedOnDevice"));
          return deviceArg(M, dev, mask, f32(n), "mask");
        },
        [=]() -> Status {
          // Read when it runs (at replay for a captured call), as the kernel does.
          emulated::dropoutForward(x, y, mask, n, keep, seedOnDevice ? *seedOnDevice : seed);
          return {};
        });
  }

  Status softmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols) noexcept override {
    const char* M = "softmaxForward";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, x, f32(rows * cols), "x"));
          return deviceArg(M, dev, y, f32(rows * cols), "y");
        },
        [=]() -> Status {
          emulated::softmaxForward(x, y, rows, cols);
          return {};
        });
  }

  Status softmaxBackward(int dev, const float* y, const float* g, float* dx, int64_t rows,
                         int64_t cols) noexcept override {
    const char* M = "softmaxBackward";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, y, f32(rows * cols), "y"));
          EMU_TRY(deviceArg(M, dev, g, f32(rows * cols), "g"));
          return deviceArg(M, dev, dx, f32(rows * cols), "dx");
        },
        [=]() -> Status {
          emulated::softmaxBackward(y, g, dx, rows, cols);
          return {};
        });
  }

  Status crossEntropyForward(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                             int64_t classes, double scale, double* sum) noexcept override {
    const char* M = "crossEntropyForward";
    EMU_TRY(targetGiven(M, dev, labels, probs));
    if (rows <= 0 || classes <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(classTargets(M, dev, logits, labels, probs, rows, classes));
          return deviceArg(M, dev, sum, sizeof(double), "sum");
        },
        [=]() -> Status {
          EMU_TRY(labelsInRange(M, labels, rows, classes));  // the labels as they are when the kernel runs
          *sum += emulated::crossEntropySum(logits, labels, probs, rows, classes) * scale;
          return {};
        });
  }

  Status crossEntropyBackward(int dev, const float* logits, const int64_t* labels, const float* probs, float* grad,
                              int64_t rows, int64_t classes) noexcept override {
    const char* M = "crossEntropyBackward";
    EMU_TRY(targetGiven(M, dev, labels, probs));
    if (rows <= 0 || classes <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(classTargets(M, dev, logits, labels, probs, rows, classes));
          return deviceArg(M, dev, grad, f32(rows * classes), "grad");
        },
        [=]() -> Status {
          EMU_TRY(labelsInRange(M, labels, rows, classes));
          emulated::crossEntropyBackward(logits, labels, probs, grad, rows, classes);
          return {};
        });
  }

  Status mseForward(int dev, const float* y, const float* t, int64_t n, double scale, double* sum) noexcept override {
    const char* M = "mseForward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
          EMU_TRY(deviceArg(M, dev, t, f32(n), "t"));
          return deviceArg(M, dev, sum, sizeof(double), "sum");
        },
        [=]() -> Status {
          *sum += emulated::squaredErrorSum(y, t, n) * scale;
          return {};
        });
  }

  Status mseBackward(int dev, const float* y, const float* t, float* grad, int64_t n) noexcept override {
    const char* M = "mseBackward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
          EMU_TRY(deviceArg(M, dev, t, f32(n), "t"));
          return deviceArg(M, dev, grad, f32(n), "grad");
        },
        [=]() -> Status {
          emulated::mseBackward(y, t, grad, n);
          return {};
        });
  }

  Status countCorrect(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                      int64_t classes, double* sum) noexcept override {
    const char* M = "countCorrect";
    EMU_TRY(targetGiven(M, dev, labels, probs));
    if (rows <= 0 || classes <= 0) return {};
    // Labels are compared, never used as an index: out-of-range ones just never match.
    return run(
        dev, M,
        [=]() -> Status {
          EMU_TRY(classTargets(M, dev, logits, labels, probs, rows, classes));
          return deviceArg(M, dev, sum, sizeof(double), "sum");
        },
        [=]() -> Status {
          *sum += static_cast<double>(emulated::countCorrect(logits, labels, probs, rows, classes));
          return {};
        });
  }

  // ---- optimizers (kernels_optim.cu, nn/sgd.cpp, nn/adam.cpp) ----
  // With `scalars`, the per-step values are read from device memory when the step runs: at each
  // replay of a captured step, what the engine wrote there before the launch (api.h).

  Status sgdStep(int dev, const OptimizerTensor* tensors, int count, float lr, float momentum, float weightDecay,
                 bool nesterov, const float* scalars) noexcept override {
    const char* M = "sgdStep";
    EMU_TRY(useDevice(dev));
    EMU_TRY(tensorList(M, tensors, count));
    if (count == 0) return {};
    const std::vector<OptimizerTensor> list(tensors, tensors + count);  // the caller's array may go
    return run(
        dev, M,
        [=]() -> Status {
          for (const OptimizerTensor& t : list) EMU_TRY(optimizerTensor(M, dev, t, t.m != nullptr, false));
          if (scalars) EMU_TRY(deviceArg(M, dev, scalars, f32(1), "scalars"));  // {lr}
          return {};
        },
        [=]() -> Status {
          const float rate = scalars ? scalars[0] : lr;
          for (const OptimizerTensor& t : list) emulated::sgdStep(t.p, t.g, t.m, t.n, rate, momentum, weightDecay, nesterov);
          return {};
        });
  }

  Status adamStep(int dev, const OptimizerTensor* tensors, int count, float stepSize, float b1, float b2, float eps,
                  float invSqrtBc2, float l2, float decay, const float* scalars) noexcept override {
    const char* M = "adamStep";
    EMU_TRY(useDevice(dev));
    EMU_TRY(tensorList(M, tensors, count));
    if (count == 0) return {};
    const std::vector<OptimizerTensor> list(tensors, tensors + count);
    return run(
        dev, M,
        [=]() -> Status {
          for (const OptimizerTensor& t : list) EMU_TRY(optimizerTensor(M, dev, t, true, true));
          if (scalars) EMU_TRY(deviceArg(M, dev, scalars, f32(3), "scalars"));  // {stepSize, invSqrtBc2, decay}
          return {};
        },
        [=]() -> Status {
          for (const OptimizerTensor& t : list) {
            if (scalars) {
              emulated::adamStep(t.p, t.g, t.m, t.v, t.n, scalars[0], b1, b2, eps, scalars[1], l2, scalars[2]);
            } else {
              emulated::adamStep(t.p, t.g, t.m, t.v, t.n, stepSize, b1, b2, eps, invSqrtBc2, l2, decay);
            }
          }
          return {};
        });
  }

  // ---- CUDA graphs ----

  Status graphBeginCapture(int dev) noexcept override {
    EMU_TRY(useDevice(dev));
    std::unique_ptr<Capture> fresh(new (std::nothrow) Capture);
    if (!fresh) return cudaError("cudaStreamBeginCapture", dev, kOutOfMemory);
    Lock lock(mutex_);
    if (Capture* c = capture_[dev].get()) {
      const Status why = cat(cudaError("cudaStreamBeginCapture", dev, kCaptureUnsupported), " (emulator: ",
                             cudaDev(dev), " is already capturing a graph; the capture is invalidated)");
      invalidate(*c, why);
      return why;
    }
    fresh->serial = nextCapture_++;
    capture_[dev] = std::move(fresh);
    return {};
  }

  // Ends the capture, whatever happens: a failed capture is discarded.
  Status graphEndCapture(int dev, void** graphExec) noexcept override {
    *graphExec = nullptr;
    EMU_TRY(useDevice(dev));
    std::unique_ptr<Capture> c;
    {
      Lock lock(mutex_);
      c = std::move(capture_[dev]);
    }
    if (!c) {
      return cat(cudaError("cudaStreamEndCapture", dev, kIllegalState), " (emulator: ", cudaDev(dev),
                 " is not capturing a graph)");
    }
    Status why = captureFault(dev, *c);
    const char* refuse = std::getenv("CYXWIZ_EMULATED_CAPTURE_FAIL");
    if (why.empty() && refuse && std::strcmp(refuse, "1") == 0) {
      why = cat(cudaError("cudaGraphInstantiate", dev, kInvalidValue), " (emulator: CYXWIZ_EMULATED_CAPTURE_FAIL=1)");
    }
    Graph* g = why.empty() ? new (std::nothrow) Graph : nullptr;
    if (why.empty() && !g) why = cudaError("cudaGraphInstantiate", dev, kOutOfMemory);
    if (!why.empty()) {
      discard(*c);
      return why;
    }
    g->serial = c->serial;
    g->dev = dev;
    g->nodes = std::move(c->nodes);
    g->blocks = std::move(c->blocks);
    g->marks = std::move(c->marks);
    Lock lock(mutex_);
    graphs_.insert(g);
    *graphExec = g;
    return {};
  }

  // Runs the graph's calls in capture order, each checked again first; the first failure stops the
  // replay (as a fault would) and is returned.
  Status graphLaunch(int dev, void* graphExec) noexcept override {
    EMU_TRY(useDevice(dev));
    auto* g = static_cast<Graph*>(graphExec);
    {
      Lock lock(mutex_);
      if (!graphs_.count(g)) {
        return cat(cudaError("cudaGraphLaunch", dev, kInvalidValue),
                   " (emulator: not a live graph from graphEndCapture: destroyed, or never made)");
      }
      if (g->dev != dev) {
        return cat(cudaError("cudaGraphLaunch", dev, kInvalidValue), " (emulator: the graph was captured on ",
                   cudaDev(g->dev), ")");
      }
      if (Capture* c = capture_[dev].get()) {
        const Status why = cat("emulator: graphLaunch on ", cudaDev(dev), " while it is capturing a graph: "
                               "launching a graph inside a capture is not emulated; the capture is invalidated");
        invalidate(*c, why);
        return why;
      }
    }
    return replay(dev, *g);
  }

  void graphDestroy(void* graphExec) noexcept override {
    if (!graphExec) return;
    auto* g = static_cast<Graph*>(graphExec);
    {
      Lock lock(mutex_);
      if (!graphs_.erase(g)) {
        warn("graphDestroy of a graph that is not live (destroyed twice?); ignored");
        return;
      }
    }
    for (const Block& b : g->blocks) std::free(b.base);  // registered in allocs_ only during a replay
    delete g;
  }

  Status recordComputeEvent(int dev, void** event) noexcept override {
    return recordEvent(dev, Stream::Compute, event);
  }

  // ---- events ----

  // The communication stream waits for the compute stream: while dev is capturing, it joins the capture
  // (api.h), so what it is given next (collectives, events) records too.
  Status commWaitsForCompute(int dev) noexcept override {
    EMU_TRY(useDevice(dev));
    Node node{"commWaitsForCompute", {}, [this, dev]() -> Status {
                Lock lock(mutex_);
                if (!liveBlock(commBlocked_[dev])) commBlocked_[dev] = liveBlock(computeBlocked_[dev]);
                return {};
              }};
    {
      Lock lock(mutex_);
      if (Capture* c = capture_[dev].get()) {
        c->commJoined = true;
        c->nodes.push_back(std::move(node));
        return {};
      }
    }
    return node.body();
  }

  // The compute stream waits for the event's point: behind a hung collective, it hangs too (its later
  // events stay incomplete, synchronize refuses) until that communicator is aborted or destroyed.
  Status computeWaitsFor(int dev, void* event) noexcept override {
    EMU_TRY(useDevice(dev));
    Node node{"computeWaitsFor", {}, {}};
    {
      Lock lock(mutex_);
      auto* e = static_cast<Event*>(event);
      if (!events_.count(e)) {
        return cat(cudaError("cudaStreamWaitEvent", dev, kInvalidHandle),
                   " (emulator: not a live event from recordCommEvent or recordComputeEvent)");
      }
      Capture* c = capture_[dev].get();
      EMU_TRY(waitAllowed(dev, c, *e));
      node.body = [this, dev, mark = e->mark]() -> Status {
        Lock lock(mutex_);
        if (!liveBlock(computeBlocked_[dev])) computeBlocked_[dev] = liveBlock(mark->blockedBy);
        return {};
      };
      if (c) {
        if (e->stream == Stream::Comm) c->joined = std::max(c->joined, e->collectives);
        c->nodes.push_back(std::move(node));
        return {};
      }
    }
    return node.body();
  }

  Status computeWaitsForStream(int dev, uintptr_t stream) noexcept override {
    EMU_TRY(useDevice(dev));
    // The library records an event on the producer's stream, which is not capturing, and makes the
    // compute stream wait for it: a capture may not depend on work outside it.
    EMU_TRY(refuseWhileCapturing(dev, "cudaStreamWaitEvent (producer's stream)", kCaptureIsolation,
                                 "computeWaitsForStream"));
    // 0 is not a valid __cuda_array_interface__ stream (the spec reserves it); anything else is a
    // foreign stream the emulator has nothing queued on.
    if (stream == 0) return cat("emulator: computeWaitsForStream got stream 0, which __cuda_array_interface__ forbids");
    return {};
  }

  Status recordCommEvent(int dev, void** event) noexcept override { return recordEvent(dev, Stream::Comm, event); }

  Status eventQuery(void* event, bool* done) noexcept override {
    *done = false;
    Lock lock(mutex_);
    auto* e = static_cast<Event*>(event);
    if (!events_.count(e)) {
      return cat(cudaError("cudaEventQuery", -1, kInvalidHandle),
                 " (emulator: not a live event from recordCommEvent or recordComputeEvent)");
    }
    if (e->capture != 0) {
      // It marks a point of the graph, reached at each replay, never a point of the stream.
      Status why = cat(cudaError("cudaEventQuery", -1, kCapturedEvent), " (emulator: the event was recorded while ",
                       cudaDev(e->dev), " was capturing a graph; record one after graphLaunch to wait for a replay");
      Capture* c = capture_[e->dev].get();
      if (c && c->serial == e->capture) {
        why += "; the capture is invalidated";
        invalidate(*c, why + ")");
      }
      return why + ")";
    }
    *done = liveBlock(e->mark->blockedBy) == 0;
    return {};
  }

  void eventRelease(void* event) noexcept override {
    if (!event) return;
    auto* e = static_cast<Event*>(event);
    {
      Lock lock(mutex_);
      if (!events_.erase(e)) {
        warn("eventRelease of an event that is not live (released twice?); ignored");
        return;
      }
    }
    delete e;  // a graph's nodes keep using the Mark of an event recorded in its capture
  }

  // ---- NCCL ----
  // One rank runs in this process: a collective copies send to recv. Several ranks are separate
  // processes that meet in a shared-memory segment named by the unique id (emulated_nccl.h): a
  // collective exchanges through it synchronously, waiting for its peers at most the communicator's
  // timeout; a captured one exchanges at each replay.

  Status ncclUniqueId(std::string* id) noexcept override {
    *id = emulated::makeNcclUniqueId();
    return {};
  }

  Status ncclInit(int dev, int nranks, int rank, const std::string& id, void** comm) noexcept override {
    *comm = nullptr;
    if (id.size() != kNcclUniqueIdBytes) {
      return cat("ncclInit on ", cudaDev(dev), ": the NCCL unique id has ", id.size(), " bytes, expected ",
                 kNcclUniqueIdBytes);
    }
    EMU_TRY(useDevice(dev));
    const std::string failed = cat("ncclCommInitRankConfig on ", cudaDev(dev), " failed: ");
    if (nranks < 1) return cat(failed, "invalid argument (emulator: a communicator of ", nranks, " ranks)");
    if (rank < 0 || rank >= nranks) {
      return cat(failed, "invalid argument (emulator: rank ", rank, " of a ", nranks, "-rank communicator)");
    }
    if (!emulated::isNcclUniqueId(id)) {
      return cat(failed, "invalid argument (emulator: the unique id was not made by ncclUniqueId)");
    }
    std::unique_ptr<Comm> c(new (std::nothrow) Comm);
    if (!c) return cat(failed, "out of host memory");
    if (nranks > 1) {
      // Joins the segment and returns at once: the peers are waited for by the first collective.
      emulated::SharedComm* shared = nullptr;
      const Status why = emulated::SharedComm::open(id, nranks, rank, &shared);
      if (!why.empty()) return cat(failed, "unhandled system error (emulator: ", why, ")");
      c->shared.reset(shared);
    }
    c->id = nextCommId_.fetch_add(1);
    c->dev = dev;
    c->nranks = nranks;
    c->rank = rank;
    Lock lock(mutex_);
    comms_.insert(c.get());
    *comm = c.release();
    return {};
  }

  // Never in progress: init and collectives are synchronous here.
  Status ncclState(void* comm, bool* inProgress) noexcept override {
    *inProgress = false;
    Lock lock(mutex_);
    auto* c = static_cast<Comm*>(comm);
    if (!comms_.count(c)) return cat("ncclCommGetAsyncError failed: invalid argument (emulator: not a live communicator)");
    if (c->aborted) return cat("ncclCommGetAsyncError: remote process exited or there was a network error (emulated abort)");
    if (!c->error.empty()) return cat("the NCCL communicator failed: ", c->error);  // as the real library says it
    return {};
  }

  // While dev is capturing, the collective records only once the communication stream has joined the
  // capture (commWaitsForCompute); the compute stream must then wait for it (computeWaitsFor on a
  // later recordCommEvent) before graphEndCapture, as CUDA requires every captured stream to rejoin.
  Status ncclCollective(void* comm, int dev, CollectiveKind kind, const void* send, void* recv, size_t count,
                        ElemType type, ReduceKind op, int root) noexcept override {
    const size_t item = elemBytes(type);
    if (!item) return cat("ncclCollective: unknown ElemType ", int(type));
    if (op != ReduceKind::Sum && op != ReduceKind::Avg && op != ReduceKind::Max && op != ReduceKind::Min &&
        op != ReduceKind::Product) {
      return cat("ncclCollective: unknown ReduceKind ", int(op));
    }
    EMU_TRY(useDevice(dev));
    const char* call = emulated::collectiveName(kind);
    if (!call) return cat("ncclCollective: unknown CollectiveKind ", int(kind));
    uint64_t commId = 0;
    size_t nranks = 1;
    {
      Lock lock(mutex_);
      auto* c = static_cast<Comm*>(comm);
      if (!comms_.count(c)) {
        return cat(call, " on ", cudaDev(dev), " failed: invalid argument (emulator: not a live communicator)");
      }
      if (c->aborted) {
        return cat(call, " on ", cudaDev(dev), " failed: invalid usage (emulator: the communicator was aborted)");
      }
      if (c->dev != dev) {
        return cat(call, " on ", cudaDev(dev), " failed: invalid argument (emulator: the communicator is on ",
                   cudaDev(c->dev), ")");
      }
      if (kind == CollectiveKind::Broadcast && (root < 0 || root >= c->nranks)) {
        return cat(call, " on ", cudaDev(dev), " failed: invalid argument (emulator: root ", root, " of a ",
                   c->nranks, "-rank communicator)");
      }
      commId = c->id;
      nranks = static_cast<size_t>(c->nranks);
    }
    // send holds count elements (nranks * count for ReduceScatter), recv count (nranks * count for AllGather).
    const size_t sendBytes = count * item * (kind == CollectiveKind::ReduceScatter ? nranks : 1);
    const size_t recvBytes = count * item * (kind == CollectiveKind::AllGather ? nranks : 1);
    const emulated::CollectiveCall args{kind, send, recv, count, type, op, root};
    Node node{call,
              [=]() -> Status {
                const std::string who = cat("ncclCollective (", call, ")");
                EMU_TRY(commStillUsable(call, dev, commId));  // at a replay, the communicator may be gone
                EMU_TRY(deviceArg(who.c_str(), dev, send, sendBytes, "send"));
                return deviceArg(who.c_str(), dev, recv, recvBytes, "recv");
              },
              [=]() { return runCollective(dev, commId, args); }};
    EMU_TRY(node.check());
    {
      Lock lock(mutex_);
      if (Capture* c = capture_[dev].get()) {
        if (!c->commJoined) {
          const Status why = cat("emulator: ", call, " on ", cudaDev(dev), " while it is capturing a graph, but its "
                                 "communication stream has not joined the capture (commWaitsForCompute first): the "
                                 "collective would run now, once, instead of at each replay; the capture is "
                                 "invalidated");
          invalidate(*c, why);
          return why;
        }
        ++c->collectives;
        c->nodes.push_back(std::move(node));
        return {};
      }
    }
    return node.body();
  }

  // Unblocks this rank (its hung collectives complete) and, with several ranks, tells the peers: one
  // waiting for this rank stops with NCCL's remote error.
  void ncclAbort(void* comm) noexcept override {
    if (!comm) return;
    Lock lock(mutex_);
    auto* c = static_cast<Comm*>(comm);
    if (!comms_.count(c)) {
      warn("ncclAbort of a communicator that is not live; ignored");
      return;
    }
    c->aborted = true;  // its blocked work returns (events complete), as after ncclCommAbort
    if (c->shared) {
      c->shared->abort();  // also ends an exchange waiting in another thread
      if (c->busy == 0) c->shared.reset();  // the engine never destroys an aborted communicator: unmap now
    }
  }

  void ncclDestroy(void* comm) noexcept override {
    if (!comm) return;
    auto* c = static_cast<Comm*>(comm);
    {
      Lock lock(mutex_);
      if (!comms_.erase(c)) {
        warn("ncclDestroy of a communicator that is not live (destroyed twice?); ignored");
        return;
      }
      // ncclCommAbort frees the communicator in real NCCL: destroying an aborted one would be a double free.
      if (c->aborted) warn("ncclDestroy of an aborted communicator (real NCCL's ncclCommAbort already freed it)");
      if (c->shared) c->shared->leave();  // a peer still waiting for this rank stops with a remote error
      if (c->busy) {
        c->destroyed = true;  // an exchange in another thread still uses it: it deletes it when done
        return;
      }
    }
    delete c;
  }

 private:
  void readDeviceCount() {
    const char* env = std::getenv("CYXWIZ_EMULATED_GPUS");
    if (!env || !*env) {
      count_ = 1;
      return;
    }
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(env, &end, 10);
    if (errno || *end || v < 0 || v > kMaxDevices) {
      count_ = 0;
      countError_ = cat("emulator: CYXWIZ_EMULATED_GPUS=\"", env, "\" is not a device count (0..", kMaxDevices, ")");
      return;
    }
    count_ = static_cast<int>(v);
  }

  Status invalidDevice(const char* call, int dev) const {
    return cudaError(call, dev, count_ == 0 ? kNoDevice : kInvalidDevice);
  }

  // state.cpp's useDevice: the index check, then cudaSetDevice.
  Status useDevice(int dev) const {
    if (dev < 0 || dev >= kMaxDevices) return cat("cuda:", dev, " is not a valid device index");
    if (dev >= count_) return invalidDevice("cudaSetDevice", dev);
    return {};
  }

  // ---- capture ----

  // A stream-ordered call on dev's compute stream. `check` validates the arguments and runs first,
  // so a bad call fails at once, whether dev is capturing or not. Then `body` runs now, or, while dev
  // is capturing, the call is recorded and both run at each replay instead.
  Status run(int dev, const char* name, Step check, Step body) {
    EMU_TRY(check());
    Node node{name, std::move(check), std::move(body)};
    {
      Lock lock(mutex_);
      if (Capture* c = capture_[dev].get()) {
        c->nodes.push_back(std::move(node));
        return {};
      }
    }
    return node.body();
  }

  // A call that CUDA refuses on a capturing stream: while dev is capturing, its error, and the capture
  // is invalidated (graphEndCapture fails), as CUDA does. Empty when dev is not capturing.
  Status refuseWhileCapturing(int dev, const char* call, CudaErr error, const char* what) {
    Lock lock(mutex_);
    Capture* c = capture_[dev].get();
    if (!c) return {};
    const Status why = cat(cudaError(call, dev, error), " (emulator: ", what, " while ", cudaDev(dev),
                           " is capturing a graph; the capture is invalidated)");
    invalidate(*c, why);
    return why;
  }

  static void invalidate(Capture& c, const Status& why) {
    if (c.invalidated.empty()) c.invalidated = why;  // the first cause is the one to fix
  }

  // Whether computeWaitsFor(dev, e) is allowed (mutex_ held); c is dev's capture in progress or null.
  // A capture may wait only for points of itself; a stream outside any capture only for real points.
  Status waitAllowed(int dev, Capture* c, const Event& e) {
    if (c) {
      if (e.capture == c->serial) return {};
      const Status why =
          e.capture == 0
              ? cat(cudaError("cudaStreamWaitEvent", dev, kCaptureIsolation), " (emulator: computeWaitsFor while ",
                    cudaDev(dev), " is capturing a graph, on an event recorded outside the capture: a replay "
                    "cannot wait for it; the capture is invalidated)")
              : cat(cudaError("cudaStreamWaitEvent", dev, kCaptureMerge), " (emulator: computeWaitsFor while ",
                    cudaDev(dev), " is capturing a graph, on an event of another capture, of ", cudaDev(e.dev),
                    "; the capture is invalidated)");
      invalidate(*c, why);
      return why;
    }
    if (e.capture != 0) {
      return cat(cudaError("cudaStreamWaitEvent", dev, kCapturedEvent), " (emulator: the event was recorded while ",
                 cudaDev(e.dev), " was capturing a graph: it marks a point of the graph, not of a stream)");
    }
    return {};
  }

  // Why a finished capture cannot become a graph; empty if it can. The capture is detached already.
  Status captureFault(int dev, const Capture& c) const {
    if (!c.invalidated.empty()) {
      return cat(cudaError("cudaStreamEndCapture", dev, kCaptureInvalidated), " (emulator: the capture was invalidated by: ",
                 c.invalidated, ")");
    }
    if (c.joined < c.collectives) {
      return cat(cudaError("cudaStreamEndCapture", dev, kCaptureUnjoined), " (emulator: ", c.collectives - c.joined,
                 " of the ", c.collectives, " collectives captured on the communication stream are not followed by a "
                 "recordCommEvent that the compute stream waits for with computeWaitsFor)");
    }
    std::string sizes;
    size_t unfreed = 0;
    for (const Block& b : c.blocks) {
      if (b.freed) continue;
      if (++unfreed <= 8) sizes += cat(unfreed > 1 ? ", " : "", b.size);
    }
    if (unfreed) {
      return cat("emulator: graphEndCapture on ", cudaDev(dev), ": the capture allocated ", unfreed,
                 " block(s) it did not free (", sizes, unfreed > 8 ? ", ..." : "", " bytes): the real library "
                 "instantiates graphs without cudaGraphInstantiateFlagAutoFreeOnLaunch, so a second launch would "
                 "fail; the engine must free inside a capture everything it allocates there. The capture is "
                 "discarded; those blocks stay allocated");
    }
    return {};
  }

  // Drops a failed capture. The memory it freed goes back to the host heap; the blocks it did not free
  // become ordinary allocations, which the engine may still free (as graph memory left unfreed
  // outlives its graph in CUDA).
  void discard(Capture& c) {
    std::vector<Block> release;
    {
      Lock lock(mutex_);
      for (const Block& b : c.blocks) {
        if (b.freed) {
          release.push_back(b);
        } else if (auto it = allocs_.find(addr(b.base)); it != allocs_.end()) {
          it->second.capture = 0;
        }
      }
    }
    for (const Block& b : release) std::free(b.base);
  }

  // A graph-owned block freed in its capture (mutex_ held): from here on (in the capture, and at each
  // replay from this point) it is not live, but the graph keeps the memory.
  void freeInCapture(Capture& c, std::map<uintptr_t, Alloc>::iterator it) {
    void* p = reinterpret_cast<void*>(it->first);
    allocs_.erase(it);
    for (Block& b : c.blocks) {
      if (b.base == p) b.freed = true;
    }
    c.nodes.push_back(Node{"free", {}, [this, p]() -> Status {
                             Lock lock(mutex_);
                             allocs_.erase(addr(p));
                             return {};
                           }});
  }

  Status replay(int dev, const Graph& g) {
    Status failed;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& node = g.nodes[i];
      Status s = node.check ? node.check() : Status();
      if (s.empty()) s = node.body();
      if (!s.empty()) {
        failed = cat("emulator: graphLaunch on ", cudaDev(dev), ": captured call ", i + 1, " of ", g.nodes.size(),
                     " (", node.name, ") failed at replay: ", s);
        break;
      }
    }
    // A replay cut short leaves no graph memory live.
    Lock lock(mutex_);
    for (const Block& b : g.blocks) allocs_.erase(addr(b.base));
    return failed;
  }

  // ---- events ----

  Status recordEvent(int dev, Stream stream, void** event) {
    *event = nullptr;
    EMU_TRY(useDevice(dev));
    const char* name = stream == Stream::Comm ? "recordCommEvent" : "recordComputeEvent";
    std::unique_ptr<Event> e(new (std::nothrow) Event);
    if (!e) return cudaError("cudaEventCreateWithFlags", dev, kOutOfMemory);
    e->dev = dev;
    e->stream = stream;
    Lock lock(mutex_);
    Capture* c = capture_[dev].get();
    if (c && (stream == Stream::Compute || c->commJoined)) {
      // A point of the graph: each replay sets it when it gets there.
      c->marks.emplace_back(new Mark);
      e->mark = c->marks.back().get();
      e->capture = c->serial;
      e->collectives = c->collectives;
      c->nodes.push_back(Node{name, {}, [this, dev, stream, mark = e->mark]() -> Status {
                                Lock lock(mutex_);
                                mark->blockedBy = liveBlock(blockedStream(dev, stream));
                                return {};
                              }});
    } else {
      e->mark->blockedBy = liveBlock(blockedStream(dev, stream));
    }
    *event = e.get();
    events_.insert(e.release());
    return {};
  }

  // The communicator of the hung collective that dev's stream waits behind, or 0 (mutex_ held).
  uint64_t& blockedStream(int dev, Stream stream) {
    return stream == Stream::Comm ? commBlocked_[dev] : computeBlocked_[dev];
  }

  // `id` if it still blocks (a live communicator not aborted), else 0 (mutex_ held). A destroyed one
  // no longer blocks: ncclDestroy's finalize times out and aborts.
  uint64_t liveBlock(uint64_t id) const {
    if (id == 0) return 0;
    for (const Comm* c : comms_) {
      if (c->id == id) return c->aborted ? 0 : id;
    }
    return 0;
  }

  // A collective's body, run now or at a replay (its check ran just before). CYXWIZ_EMULATED_NCCL_HANG,
  // a hung collective earlier on dev's communication stream, or an earlier failure of the communicator:
  // it never completes (its later events stay incomplete until an abort). One rank: send is copied to
  // recv. Several: the exchange through shared memory, outside the lock, as long as the peers take
  // (bounded); if they do not all come in time it hangs, and if a peer is gone (or called another
  // collective) the communicator fails with the error ncclState reports.
  Status runCollective(int dev, uint64_t commId, const emulated::CollectiveCall& call) {
    const char* hang = std::getenv("CYXWIZ_EMULATED_NCCL_HANG");
    Comm* c = nullptr;
    bool single = false;
    {
      Lock lock(mutex_);
      for (Comm* k : comms_) {
        if (k->id == commId) c = k;
      }
      if (!c || c->aborted) return {};  // the check has refused it already
      if ((hang && std::strcmp(hang, "1") == 0) || !c->error.empty()) {
        commBlocked_[dev] = commId;  // this and every later point of dev's communication stream waits
        return {};
      }
      if (liveBlock(commBlocked_[dev])) return {};  // queued behind a collective that never completes
      single = !c->shared;
      if (!single) ++c->busy;  // keeps c and its mapping while the lock is released
    }
    if (single) {
      const size_t bytes = call.count * elemBytes(call.type);
      if (bytes && call.send != call.recv) std::memmove(call.recv, call.send, bytes);
      return {};
    }
    std::string why;
    const emulated::Exchange e = c->shared->run(call, &why);
    Lock lock(mutex_);
    --c->busy;
    if (e == emulated::Exchange::Hung) {
      warn(cat(emulated::collectiveName(call.kind), " on ", cudaDev(dev), ": ", why, "; it hangs, as NCCL's would, "
               "until the communicator is aborted"));
      commBlocked_[dev] = commId;
    } else if (e == emulated::Exchange::Failed) {
      c->error = why;
      commBlocked_[dev] = commId;
    }
    if (c->busy == 0 && c->destroyed) {
      delete c;
    } else if (c->busy == 0 && c->aborted) {
      c->shared.reset();
    }
    return {};
  }

  // A recorded collective's communicator is still there when a replay runs it.
  Status commStillUsable(const char* call, int dev, uint64_t id) const {
    Lock lock(mutex_);
    for (const Comm* c : comms_) {
      if (c->id != id) continue;
      if (!c->aborted) return {};
      return cat(call, " on ", cudaDev(dev), " failed: invalid usage (emulator: the communicator was aborted)");
    }
    return cat(call, " on ", cudaDev(dev), " failed: invalid argument (emulator: the communicator was destroyed)");
  }

  // ---- argument checks ----

  static Status blasInvalid(int dev, const std::string& why) {
    return cat("cublasSgemm on ", cudaDev(dev), " failed: CUBLAS_STATUS_INVALID_VALUE (emulator: ", why, ")");
  }

  static Status unknownActivation(const char* who, int dev, Activation f) {
    return cat(who, " on ", cudaDev(dev), ": unknown Activation ", int(f));
  }

  static bool overlaps(const void* p, size_t pb, const void* q, size_t qb) {
    const auto a = addr(p), b = addr(q);
    return a < b + qb && b < a + pb;
  }

  // The live allocation containing ptr (a view may point inside one).
  bool lookup(const void* ptr, Found* out) const {
    const auto p = addr(ptr);
    Lock lock(mutex_);
    auto it = allocs_.upper_bound(p);
    if (it == allocs_.begin()) return false;
    --it;
    if (p >= it->first + it->second.size) return false;
    out->base = reinterpret_cast<const char*>(it->first);
    out->alloc = it->second;
    return true;
  }

  // `bytes` from ptr inside one live allocation of any device.
  Status anyDeviceArg(const char* who, const void* ptr, size_t bytes, const char* name, Found* f) const {
    if (!ptr) return cat("emulator: ", who, " got a null pointer as device argument ", name);
    if (!lookup(ptr, f)) {
      return cat("emulator: ", who, " got a host pointer as device argument ", name,
                 " (not inside a live allocation of any emulated device: host memory, or freed)");
    }
    const size_t offset = static_cast<size_t>(static_cast<const char*>(ptr) - f->base);
    const size_t avail = f->alloc.size - offset;
    if (bytes > avail) {
      return cat("emulator: ", who, " accesses ", bytes, " bytes of device argument ", name, ", but its allocation of ",
                 f->alloc.size, " bytes on ", cudaDev(f->alloc.dev), " has only ", avail, " from offset ", offset);
    }
    return {};
  }

  // As anyDeviceArg, and the allocation belongs to dev. Nothing to check when nothing is accessed.
  Status deviceArg(const char* who, int dev, const void* ptr, size_t bytes, const char* name) const {
    if (bytes == 0) return {};
    Found f;
    EMU_TRY(anyDeviceArg(who, ptr, bytes, name, &f));
    if (f.alloc.dev != dev) {
      return cat("emulator: ", who, " on ", cudaDev(dev), " got memory of ", cudaDev(f.alloc.dev),
                 " as device argument ", name);
    }
    return {};
  }

  // A host argument must not be device memory (the engine would hand out a device address).
  static Status tensorList(const char* who, const OptimizerTensor* tensors, int count) {
    if (count < 0 || (count > 0 && !tensors)) return cat("emulator: ", who, ": ", count, " tensors at a null array");
    return {};
  }

  // One parameter of a fused optimizer step: p, g (and m, v when used) device memory of n floats.
  Status optimizerTensor(const char* who, int dev, const OptimizerTensor& t, bool usesM, bool usesV) const {
    if (t.n < 0) return cat("emulator: ", who, ": a tensor of ", t.n, " elements");
    if (t.n == 0) return {};
    EMU_TRY(deviceArg(who, dev, t.p, f32(t.n), "p"));
    EMU_TRY(deviceArg(who, dev, t.g, f32(t.n), "g"));
    if (usesM) EMU_TRY(deviceArg(who, dev, t.m, f32(t.n), "m"));
    if (usesV) EMU_TRY(deviceArg(who, dev, t.v, f32(t.n), "v"));
    return {};
  }

  Status hostArg(const char* who, const void* ptr, const char* name) const {
    if (!ptr) return cat("emulator: ", who, " got a null pointer as host argument ", name);
    Found f;
    if (lookup(ptr, &f)) return cat("emulator: ", who, " got device memory of ", cudaDev(f.alloc.dev), " as host argument ", name);
    return {};
  }

  // The engine passes the destination's device; a peer copy from another device is legal (UVA).
  Status peerCopyCheck(int dev, const void* dst, const void* src, size_t bytes) const {
    const char* who = "copy DeviceToDevice";
    Found fd, fs;
    EMU_TRY(anyDeviceArg(who, dst, bytes, "dst", &fd));
    EMU_TRY(anyDeviceArg(who, src, bytes, "src", &fs));
    if (fd.alloc.dev != dev && fs.alloc.dev != dev) {
      return cat("emulator: ", who, " on ", cudaDev(dev), " copies ", cudaDev(fs.alloc.dev), " to ",
                 cudaDev(fd.alloc.dev), ": neither side is on the device whose stream runs it");
    }
    return {};
  }

  // cuBLAS's leading-dimension checks in row-major terms, the ranges, and no output overlapping an input.
  Status gemmCheck(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, const float* c, int64_t ldc) const {
    const char* M = "gemm";
    if (ldc < n) return blasInvalid(dev, cat("ldc ", ldc, " < n ", n));
    const size_t cBytes = f32((m - 1) * ldc + n);
    if (k <= 0) return beta == 1.0f ? Status() : deviceArg(M, dev, c, cBytes, "c");  // C = beta C only
    const int64_t needA = transA ? m : k, needB = transB ? k : n;
    if (lda < needA) return blasInvalid(dev, cat("lda ", lda, " < ", needA, transA ? " (m, A transposed)" : " (k)"));
    if (ldb < needB) return blasInvalid(dev, cat("ldb ", ldb, " < ", needB, transB ? " (k, B transposed)" : " (n)"));
    const size_t aBytes = f32(transA ? (k - 1) * lda + m : (m - 1) * lda + k);
    const size_t bBytes = f32(transB ? (n - 1) * ldb + k : (k - 1) * ldb + n);
    EMU_TRY(deviceArg(M, dev, a, aBytes, "a"));
    EMU_TRY(deviceArg(M, dev, b, bBytes, "b"));
    EMU_TRY(deviceArg(M, dev, c, cBytes, "c"));
    if (overlaps(c, cBytes, a, aBytes)) return cat("emulator: gemm: the output c overlaps the input a");
    if (overlaps(c, cBytes, b, bBytes)) return cat("emulator: gemm: the output c overlaps the input b");
    return {};
  }

  Status broadcastRowsCheck(int dev, const float* row, const float* out, int64_t rows, int64_t cols) const {
    const char* M = "broadcastRows";
    EMU_TRY(deviceArg(M, dev, row, f32(cols), "row"));
    return deviceArg(M, dev, out, f32(rows * cols), "out");
  }

  // The class-target methods take labels or probs, and validate dev next.
  Status targetGiven(const char* who, int dev, const int64_t* labels, const float* probs) const {
    if (!labels && !probs) return cat(who, " on ", cudaDev(dev), ": neither labels nor probs was given");
    return useDevice(dev);
  }

  // The ranges of the class-target methods' arguments.
  Status classTargets(const char* who, int dev, const float* logits, const int64_t* labels, const float* probs,
                      int64_t rows, int64_t classes) const {
    if (labels && probs) return cat("emulator: ", who, " got both labels and probs (api.h: the other is null)");
    EMU_TRY(deviceArg(who, dev, logits, f32(rows * classes), "logits"));
    if (labels) return deviceArg(who, dev, labels, i64(rows), "labels");
    return deviceArg(who, dev, probs, f32(rows * classes), "probs");
  }

  // Labels used as an index must be in range (api.h: they arrive range-checked). Checked on the values
  // the kernel reads, when it runs: in a capture, the labels of the capture are not yet written.
  static Status labelsInRange(const char* who, const int64_t* labels, int64_t rows, int64_t classes) {
    if (!labels) return {};
    for (int64_t r = 0; r < rows; ++r) {
      if (labels[r] < 0 || labels[r] >= classes) {
        return cat("emulator: ", who, ": labels[", r, "] = ", labels[r], " is outside [0, ", classes,
                   ") (api.h: labels arrive range-checked)");
      }
    }
    return {};
  }

  int count_ = 1;
  Status countError_;
  std::atomic<bool> tf32_{false};
  std::atomic<uint64_t> nextCommId_{1};

  mutable Mutex mutex_;  // guards everything below
  std::map<uintptr_t, Alloc> allocs_;  // live device memory: base -> (dev, bytes, owning capture)
  std::map<uintptr_t, Alloc> pinned_;  // mallocHost memory, only to catch foreign or double freeHost
  std::set<Event*> events_;
  std::set<Comm*> comms_;
  std::set<Graph*> graphs_;
  std::unique_ptr<Capture> capture_[kMaxDevices];  // per device: the capture in progress, or null
  uint64_t nextCapture_ = 1;
  // Per device and stream: the communicator of the hung collective the stream waits behind, or 0. The
  // communication stream by running one; the compute stream by waiting for an event behind one.
  uint64_t commBlocked_[kMaxDevices] = {};
  uint64_t computeBlocked_[kMaxDevices] = {};
};

#undef EMU_TRY

}  // namespace

}  // namespace cyxwiz::cuda

// The one exported symbol, with the real library's version check and message (api_impl.cpp).
extern "C" __attribute__((visibility("default"))) cyxwiz::cuda::Api* cyxwiz_cuda_api(int expectedVersion,
                                                                                    const char** error) {
  if (expectedVersion != cyxwiz::cuda::kApiVersion) {
    static thread_local char message[256];
    std::snprintf(message, sizeof message,
                  "libcyxwiz_cuda.so implements CUDA API version %d but the engine expects version %d: the library "
                  "and the engine were built from different sources; reinstall pycyxwiz",
                  cyxwiz::cuda::kApiVersion, expectedVersion);
    if (error) *error = message;
    return nullptr;
  }
  // Never destroyed, as the real one: the engine may call it during static destruction.
  static cyxwiz::cuda::EmulatedApi* api = new (std::nothrow) cyxwiz::cuda::EmulatedApi();
  if (error) *error = api ? nullptr : "out of host memory";
  return api;
}
