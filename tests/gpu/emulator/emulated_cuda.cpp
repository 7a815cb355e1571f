// TEST DOUBLE, NOT GPU SUPPORT. A host-memory emulation of the ABI of libcyxwiz_cuda.so
// (cyxwiz/cuda/api.h), loaded by the engine through CYXWIZ_CUDA_LIBRARY so that its GPU plumbing
// (device tensors, model.to, the GPU branches of layers/losses/optimizers, DDP device buckets, the
// NCCL backend at world size 1, pinned staging) runs in CI on machines without a GPU. It says nothing
// about the real CUDA kernels, cuBLAS or NCCL; never ship it or present it as GPU support.
//
// Its point is to be stricter than a GPU where the engine can go wrong unnoticed:
//   - "device memory" is host memory in an allocation registry; every device pointer argument must lie,
//     with the whole range the method touches, inside a live allocation of that `dev` (a view at an
//     offset is fine), and every host argument must not be one: host/device mix-ups, stale pointers,
//     wrong devices and short buffers return an error Status ("emulator: gemm got a host pointer as
//     device argument a") instead of corrupting memory or silently working;
//   - fresh allocations are filled with 0xFF bytes (a NaN as float32, -1 as integers), so code that
//     forgets to initialise device memory produces NaNs;
//   - copies must match their CopyKind; events and communicators are checked against live handles.
// The arithmetic follows the CUDA kernels of cyxwiz/cuda/*.cu (which follow the CPU modules), with
// the dropout mask bit-identical to the GPU's counter-based stream. Everything runs synchronously on
// the calling thread; synchronize and query are no-ops. See README.md beside this file.
//
// Environment: CYXWIZ_EMULATED_GPUS (device count, default 1, read once when the library is first
// used); CYXWIZ_EMULATED_NCCL_HANG=1 (read at each collective: the collective never completes until
// its communicator is aborted or destroyed, for the engine's timeout/abort path).
//
// Build, from the repository root (nothing but the C++ standard library):
//   g++ -std=c++17 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -I/work/main/cpp
//       tests/gpu/emulator/*.cpp -o OUT/libcyxwiz_cuda_emulated.so
// Only cyxwiz_cuda_api is exported: the messages are built with cat() below rather than std::to_string
// and std::string's operator+, and no handle type is a std:: template over std:: types only, because
// libstdc++ gives such inline instantiations default visibility despite -fvisibility=hidden (at -O0,
// un-inlined libstdc++ inline functions still show up as weak symbols: harmless under RTLD_LOCAL).
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <type_traits>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda {

namespace {

constexpr int kMaxDevices = 64;           // as state.cpp
constexpr size_t kDeviceAlignment = 256;  // as cudaMalloc
constexpr size_t kHostAlignment = 64;
constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
constexpr char kUniqueIdTag[] = "pycyxwiz-emulated-nccl-id:";
constexpr const char* kNoGraphs = "emulator: CUDA graphs are not emulated";

// ---- messages ----

void put(std::string& s, const char* p) { s.append(p); }
void put(std::string& s, const std::string& p) { s.append(p); }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void put(std::string& s, T v) {
  char b[32];
  if constexpr (std::is_signed_v<T>) {
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(b, sizeof b, "%llu", static_cast<unsigned long long>(v));
  }
  s.append(b);
}
void put(std::string& s, float v) {  // as std::to_string(float) in the real messages
  char b[64];
  std::snprintf(b, sizeof b, "%f", static_cast<double>(v));
  s.append(b);
}

template <class... T>
std::string cat(const T&... parts) {
  std::string s;
  (put(s, parts), ...);
  return s;
}

std::string cudaDev(int dev) { return cat("cuda:", dev); }

void warn(const char* message) {
  std::fprintf(stderr, "pycyxwiz CUDA emulator: %s\n", message);
  std::fflush(stderr);
}
void warn(const std::string& message) { warn(message.c_str()); }

// "cudaSetDevice on cuda:5 failed: invalid device ordinal (cudaErrorInvalidDevice)", as errors.h.
Status cudaError(const char* call, int dev, const char* text, const char* name) {
  if (dev < 0) return cat(call, " failed: ", text, " (", name, ")");
  return cat(call, " on cuda:", dev, " failed: ", text, " (", name, ")");
}

#define EMU_TRY(expr)                       \
  do {                                      \
    ::cyxwiz::cuda::Status emu_s_ = (expr); \
    if (!emu_s_.empty()) return emu_s_;     \
  } while (0)

size_t f32(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
size_t i64(int64_t n) { return static_cast<size_t>(n) * sizeof(int64_t); }

size_t elemBytes(ElemType t) {
  switch (t) {
    case ElemType::Float32: return 4;
    case ElemType::Float64: return 8;
    case ElemType::Int32: return 4;
    case ElemType::Int64: return 8;
  }
  return 0;
}

const char* copyKindName(CopyKind k) {
  switch (k) {
    case CopyKind::HostToDevice: return "HostToDevice";
    case CopyKind::DeviceToHost: return "DeviceToHost";
    case CopyKind::DeviceToDevice: return "DeviceToDevice";
  }
  return "?";
}

// ---- the math, as the CUDA kernels (cyxwiz/cuda/kernels_*.cu) ----

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

float sigmoid(float x) {  // branch on the sign so exp never overflows
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

float activate(Activation f, float x) {
  switch (f) {
    case Activation::ReLU: return x > 0.0f ? x : 0.0f;
    case Activation::GELU: return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
    case Activation::Sigmoid: return sigmoid(x);
    case Activation::Tanh: return std::tanh(x);
  }
  return x;
}

// g * f'(x), f' at the layer input x.
float activateGrad(Activation f, float x, float g) {
  switch (f) {
    case Activation::ReLU: return x > 0.0f ? g : 0.0f;
    case Activation::GELU: {
      const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
      return g * (cdf + x * pdf);
    }
    case Activation::Sigmoid: {
      const float y = sigmoid(x);
      return g * y * (1.0f - y);
    }
    case Activation::Tanh: {
      const float y = std::tanh(x);
      return g * (1.0f - y * y);
    }
  }
  return g;
}

bool knownActivation(Activation f) {
  return f == Activation::ReLU || f == Activation::GELU || f == Activation::Sigmoid || f == Activation::Tanh;
}

// kernels_elementwise.cu's splitmix64: element i's draw depends only on (seed, i).
uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Row maximum as the kernels (fmaxf from -inf: NaNs are skipped).
float rowMax(const float* x, int64_t cols) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) mx = std::fmax(mx, x[c]);
  return mx;
}

// kernel_utils.cuh's blockArgMax: the first maximum, NaNs never win, all NaN gives 0.
int64_t argMax(const float* row, int64_t cols) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  float best = -INFINITY;
  int64_t index = kNone;
  for (int64_t c = 0; c < cols; ++c) {
    if (row[c] > best || (row[c] == best && c < index)) {
      best = row[c];
      index = c;
    }
  }
  return index == kNone ? 0 : index;
}

// ---- handles ----

struct Comm {
  uint64_t id = 0;  // never reused
  int dev = -1;
  int nranks = 0;
  int rank = 0;
  bool aborted = false;
};

struct Event {
  uint64_t blockedBy = 0;  // the communicator whose hung collective it waits for; 0: complete
};

struct Alloc {
  int dev;  // -1: pinned host memory
  size_t size;
};

struct Found {
  const char* base = nullptr;
  Alloc alloc{-1, 0};
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

  Status malloc(int dev, size_t bytes, void** out) noexcept override {
    *out = nullptr;
    EMU_TRY(useDevice(dev));
    if (bytes == 0) return {};
    const size_t padded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
    void* p = padded >= bytes ? std::aligned_alloc(kDeviceAlignment, padded) : nullptr;
    if (!p) return cudaError("cudaMallocAsync", dev, "out of memory", "cudaErrorMemoryAllocation");
    std::memset(p, 0xFF, padded);  // NaN as float32: uninitialised device memory shows
    std::lock_guard<std::mutex> lock(mutex_);
    allocs_[reinterpret_cast<uintptr_t>(p)] = Alloc{dev, bytes};
    *out = p;
    return {};
  }

  void free(int dev, void* ptr) noexcept override {
    if (!ptr) return;
    Alloc a{-1, 0};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = allocs_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == allocs_.end()) {
        // Errors are ignored by the contract; say it on stderr: a double free or a foreign pointer.
        warn(cat("free on ", cudaDev(dev), " of a pointer that is not a live device allocation (double free, an "
                 "interior pointer or host memory); ignored"));
        return;
      }
      a = it->second;
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
    if (!p) return cudaError("cudaMallocHost", -1, "out of memory", "cudaErrorMemoryAllocation");
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = Alloc{-1, bytes};  // not device memory: never looked up
    *out = p;
    return {};
  }

  void freeHost(void* ptr) noexcept override {
    if (!ptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!pinned_.erase(reinterpret_cast<uintptr_t>(ptr))) {
        warn("freeHost of a pointer that mallocHost did not return (or freed twice); ignored");
        return;
      }
    }
    std::free(ptr);
  }

  Status copy(int dev, void* dst, const void* src, size_t bytes, CopyKind kind) noexcept override {
    EMU_TRY(useDevice(dev));
    if (bytes == 0) return {};
    const std::string who = cat("copy ", copyKindName(kind));
    switch (kind) {
      case CopyKind::HostToDevice:
        EMU_TRY(deviceArg(who.c_str(), dev, dst, bytes, "dst"));
        EMU_TRY(hostArg(who.c_str(), src, "src"));
        break;
      case CopyKind::DeviceToHost:
        EMU_TRY(deviceArg(who.c_str(), dev, src, bytes, "src"));
        EMU_TRY(hostArg(who.c_str(), dst, "dst"));
        break;
      case CopyKind::DeviceToDevice: {
        // The engine passes the destination's device; a peer copy from another device is legal (UVA).
        Found fd, fs;
        EMU_TRY(anyDeviceArg(who.c_str(), dst, bytes, "dst", &fd));
        EMU_TRY(anyDeviceArg(who.c_str(), src, bytes, "src", &fs));
        if (fd.alloc.dev != dev && fs.alloc.dev != dev) {
          return cat("emulator: ", who, " on ", cudaDev(dev), " copies ", cudaDev(fs.alloc.dev), " to ",
                     cudaDev(fd.alloc.dev), ": neither side is on the device whose stream runs it");
        }
        break;
      }
      default:
        return cat("copy on ", cudaDev(dev), ": unknown CopyKind ", int(kind));
    }
    std::memmove(dst, src, bytes);
    return {};
  }

  Status memsetZero(int dev, void* dst, size_t bytes) noexcept override {
    EMU_TRY(useDevice(dev));
    if (bytes == 0) return {};
    EMU_TRY(deviceArg("memsetZero", dev, dst, bytes, "dst"));
    std::memset(dst, 0, bytes);
    return {};
  }

  Status fill(int dev, float* dst, int64_t n, float value) noexcept override {
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg("fill", dev, dst, f32(n), "dst"));
    for (int64_t i = 0; i < n; ++i) dst[i] = value;
    return {};
  }

  Status synchronize(int dev) noexcept override { return useDevice(dev); }

  Status query(int dev, bool* done) noexcept override {
    *done = false;
    EMU_TRY(useDevice(dev));
    *done = true;
    return {};
  }

  // ---- math ----

  // Stored only: the emulated GEMM is always full precision.
  void setTF32(bool enabled) noexcept override { tf32_.store(enabled, std::memory_order_relaxed); }

  Status gemm(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) noexcept override {
    const char* M = "gemm";
    EMU_TRY(useDevice(dev));
    if (m <= 0 || n <= 0) return {};
    if (ldc < n) return blasInvalid(dev, cat("ldc ", ldc, " < n ", n));
    const size_t cBytes = f32((m - 1) * ldc + n);
    if (k <= 0) {  // C = beta C, as blas.cu's scaleMatrixKernel (beta = 0 writes zeros)
      if (beta == 1.0f) return {};
      EMU_TRY(deviceArg(M, dev, c, cBytes, "c"));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          float& x = c[i * ldc + j];
          x = beta == 0.0f ? 0.0f : beta * x;
        }
      }
      return {};
    }
    // cuBLAS's leading-dimension checks, in row-major terms.
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
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const float av = transA ? a[p * lda + i] : a[i * lda + p];
          const float bv = transB ? b[j * ldb + p] : b[p * ldb + j];
          s += static_cast<double>(av) * static_cast<double>(bv);
        }
        float& x = c[i * ldc + j];
        double r = static_cast<double>(alpha) * s;
        if (beta != 0.0f) r += static_cast<double>(beta) * static_cast<double>(x);  // beta = 0: C is not read
        x = static_cast<float>(r);
      }
    }
    return {};
  }

  Status broadcastRows(int dev, const float* row, float* out, int64_t rows, int64_t cols) noexcept override {
    const char* M = "broadcastRows";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    EMU_TRY(deviceArg(M, dev, row, f32(cols), "row"));
    EMU_TRY(deviceArg(M, dev, out, f32(rows * cols), "out"));
    for (int64_t r = 0; r < rows; ++r) std::memmove(out + r * cols, row, f32(cols));
    return {};
  }

  Status addColumnSums(int dev, const float* g, float* out, int64_t rows, int64_t cols) noexcept override {
    const char* M = "addColumnSums";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    EMU_TRY(deviceArg(M, dev, g, f32(rows * cols), "g"));
    EMU_TRY(deviceArg(M, dev, out, f32(cols), "out"));
    for (int64_t j = 0; j < cols; ++j) {
      float sum = 0.0f;
      for (int64_t r = 0; r < rows; ++r) sum += g[r * cols + j];
      out[j] += sum;
    }
    return {};
  }

  // As the library's fallback path: bias broadcast, GEMM onto it, ReLU in place. (The cuBLASLt
  // epilogue computes the same up to the GEMM's float32 rounding.)
  Status linearForward(int dev, const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                       int64_t out, bool relu) noexcept override {
    const char* M = "linearForward";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || out <= 0) return {};
    EMU_TRY(deviceArg(M, dev, y, f32(rows * out), "y"));
    if (bias) EMU_TRY(broadcastRows(dev, bias, y, rows, out));
    EMU_TRY(gemm(dev, false, true, rows, out, in, 1.0f, x, in, w, in, bias ? 1.0f : 0.0f, y, out));
    if (relu) {
      for (int64_t i = 0; i < rows * out; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    }
    return {};
  }

  Status activationForward(int dev, Activation f, const float* x, float* y, int64_t n) noexcept override {
    const char* M = "activationForward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    if (!knownActivation(f)) return unknownActivation(M, dev, f);
    EMU_TRY(deviceArg(M, dev, x, f32(n), "x"));
    EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
    for (int64_t i = 0; i < n; ++i) y[i] = activate(f, x[i]);
    return {};
  }

  Status activationBackward(int dev, Activation f, const float* x, const float* g, float* dx,
                            int64_t n) noexcept override {
    const char* M = "activationBackward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    if (!knownActivation(f)) return unknownActivation(M, dev, f);
    EMU_TRY(deviceArg(M, dev, x, f32(n), "x"));
    EMU_TRY(deviceArg(M, dev, g, f32(n), "g"));
    EMU_TRY(deviceArg(M, dev, dx, f32(n), "dx"));
    for (int64_t i = 0; i < n; ++i) dx[i] = activateGrad(f, x[i], g[i]);
    return {};
  }

  Status multiply(int dev, const float* a, const float* b, float* out, int64_t n) noexcept override {
    const char* M = "multiply";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg(M, dev, a, f32(n), "a"));
    EMU_TRY(deviceArg(M, dev, b, f32(n), "b"));
    EMU_TRY(deviceArg(M, dev, out, f32(n), "out"));
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
    return {};
  }

  Status dropoutForward(int dev, const float* x, float* y, float* mask, int64_t n, float keep,
                        uint64_t seed) noexcept override {
    const char* M = "dropoutForward";
    if (!(keep > 0.0f && keep <= 1.0f)) {
      return cat("dropoutForward on ", cudaDev(dev), ": keep probability ", keep, " is outside (0, 1]");
    }
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg(M, dev, x, f32(n), "x"));
    EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
    EMU_TRY(deviceArg(M, dev, mask, f32(n), "mask"));
    const float scale = 1.0f / keep;
    for (int64_t i = 0; i < n; ++i) {
      // The top 24 bits, as the kernel and cyxwiz::uniform01: exactly representable floats in [0, 1).
      const float u = static_cast<float>(splitmix64(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
      const float mk = u < keep ? scale : 0.0f;
      mask[i] = mk;
      y[i] = x[i] * mk;
    }
    return {};
  }

  Status softmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols) noexcept override {
    const char* M = "softmaxForward";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    EMU_TRY(deviceArg(M, dev, x, f32(rows * cols), "x"));
    EMU_TRY(deviceArg(M, dev, y, f32(rows * cols), "y"));
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const float mx = rowMax(xr, cols);
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const float e = std::exp(xr[c] - mx);
        yr[c] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
    return {};
  }

  Status softmaxBackward(int dev, const float* y, const float* g, float* dx, int64_t rows,
                         int64_t cols) noexcept override {
    const char* M = "softmaxBackward";
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || cols <= 0) return {};
    EMU_TRY(deviceArg(M, dev, y, f32(rows * cols), "y"));
    EMU_TRY(deviceArg(M, dev, g, f32(rows * cols), "g"));
    EMU_TRY(deviceArg(M, dev, dx, f32(rows * cols), "dx"));
    for (int64_t r = 0; r < rows; ++r) {
      const float* yr = y + r * cols;
      const float* gr = g + r * cols;
      double dot = 0.0;
      for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(gr[c]) * yr[c];
      const float d = static_cast<float>(dot);
      for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = yr[c] * (gr[c] - d);
    }
    return {};
  }

  Status crossEntropyForward(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                             int64_t classes, double scale, double* sum) noexcept override {
    const char* M = "crossEntropyForward";
    EMU_TRY(classTargets(M, dev, logits, labels, probs, rows, classes, true));
    if (rows <= 0 || classes <= 0) return {};
    EMU_TRY(deviceArg(M, dev, sum, sizeof(double), "sum"));
    double total = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = logits + r * classes;
      const float mx = rowMax(xr, classes);
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(xr[c] - mx));
      const double logSumExp = mx + std::log(sum);
      if (labels) {
        total += logSumExp - xr[labels[r]];
      } else {
        const float* p = probs + r * classes;
        double t = 0.0;
        for (int64_t c = 0; c < classes; ++c) t += p[c] * (logSumExp - xr[c]);
        total += t;
      }
    }
    *sum += total * scale;
    return {};
  }

  Status crossEntropyBackward(int dev, const float* logits, const int64_t* labels, const float* probs, float* grad,
                              int64_t rows, int64_t classes) noexcept override {
    const char* M = "crossEntropyBackward";
    EMU_TRY(classTargets(M, dev, logits, labels, probs, rows, classes, true));
    if (rows <= 0 || classes <= 0) return {};
    EMU_TRY(deviceArg(M, dev, grad, f32(rows * classes), "grad"));
    const float invRows = 1.0f / static_cast<float>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = logits + r * classes;
      float* gr = grad + r * classes;
      const float mx = rowMax(xr, classes);
      double sum = 0.0;
      for (int64_t c = 0; c < classes; ++c) {
        const float e = std::exp(xr[c] - mx);
        gr[c] = e;
        sum += e;
      }
      const float inv = static_cast<float>(1.0 / sum);
      if (labels) {  // (softmax - onehot) / rows
        const int64_t label = labels[r];
        for (int64_t c = 0; c < classes; ++c) {
          float v = gr[c] * inv;
          if (c == label) v -= 1.0f;
          gr[c] = v * invRows;
        }
      } else {  // (softmax * mass - p) / rows
        const float* p = probs + r * classes;
        double mass = 0.0;
        for (int64_t c = 0; c < classes; ++c) mass += p[c];
        const float massF = static_cast<float>(mass);
        for (int64_t c = 0; c < classes; ++c) gr[c] = (gr[c] * inv * massF - p[c]) * invRows;
      }
    }
    return {};
  }

  Status mseForward(int dev, const float* y, const float* t, int64_t n, double scale, double* sum) noexcept override {
    const char* M = "mseForward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
    EMU_TRY(deviceArg(M, dev, t, f32(n), "t"));
    EMU_TRY(deviceArg(M, dev, sum, sizeof(double), "sum"));
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(y[i]) - t[i];
      total += d * d;
    }
    *sum += total * scale;
    return {};
  }

  Status mseBackward(int dev, const float* y, const float* t, float* grad, int64_t n) noexcept override {
    const char* M = "mseBackward";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg(M, dev, y, f32(n), "y"));
    EMU_TRY(deviceArg(M, dev, t, f32(n), "t"));
    EMU_TRY(deviceArg(M, dev, grad, f32(n), "grad"));
    const float scale = 2.0f / static_cast<float>(n);
    for (int64_t i = 0; i < n; ++i) grad[i] = scale * (y[i] - t[i]);
    return {};
  }

  Status countCorrect(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                      int64_t classes, double* sum) noexcept override {
    const char* M = "countCorrect";
    // Labels are compared, never used as an index: out-of-range ones just never match.
    EMU_TRY(classTargets(M, dev, logits, labels, probs, rows, classes, false));
    if (rows <= 0 || classes <= 0) return {};
    EMU_TRY(deviceArg(M, dev, sum, sizeof(double), "sum"));
    int64_t total = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t predicted = argMax(logits + r * classes, classes);
      const int64_t truth = labels ? labels[r] : argMax(probs + r * classes, classes);
      total += predicted == truth;
    }
    *sum += static_cast<double>(total);
    return {};
  }

  // ---- optimizers (kernels_optim.cu, nn/sgd.cpp, nn/adam.cpp) ----

  Status sgdStep(int dev, float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                 float weightDecay, bool nesterov) noexcept override {
    const char* M = "sgdStep";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg(M, dev, p, f32(n), "p"));
    EMU_TRY(deviceArg(M, dev, g, f32(n), "g"));
    if (!buf) {
      for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weightDecay * p[i]);
      return {};
    }
    EMU_TRY(deviceArg(M, dev, buf, f32(n), "buf"));
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] + weightDecay * p[i];
      const float bi = momentum * buf[i] + gi;
      buf[i] = bi;
      p[i] -= lr * (nesterov ? gi + momentum * bi : bi);
    }
    return {};
  }

  Status adamStep(int dev, float* p, const float* g, float* m, float* v, int64_t n, float stepSize, float b1,
                  float b2, float eps, float invSqrtBc2, float l2, float decay) noexcept override {
    const char* M = "adamStep";
    EMU_TRY(useDevice(dev));
    if (n <= 0) return {};
    EMU_TRY(deviceArg(M, dev, p, f32(n), "p"));
    EMU_TRY(deviceArg(M, dev, g, f32(n), "g"));
    EMU_TRY(deviceArg(M, dev, m, f32(n), "m"));
    EMU_TRY(deviceArg(M, dev, v, f32(n), "v"));
    for (int64_t i = 0; i < n; ++i) {
      const float pi = p[i];
      const float gi = g[i] + l2 * pi;
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = pi * decay - stepSize * mi / (std::sqrt(vi) * invSqrtBc2 + eps);
    }
    return {};
  }

  // ---- graphs: not emulated ----

  Status graphBeginCapture(int dev) noexcept override {
    EMU_TRY(useDevice(dev));
    return cat(kNoGraphs);
  }

  Status graphEndCapture(int dev, void** graphExec) noexcept override {
    *graphExec = nullptr;
    EMU_TRY(useDevice(dev));
    return cat(kNoGraphs);
  }

  Status graphLaunch(int dev, void*) noexcept override {
    EMU_TRY(useDevice(dev));
    return cat(kNoGraphs);
  }

  void graphDestroy(void*) noexcept override {}

  // ---- events ----

  Status commWaitsForCompute(int dev) noexcept override { return useDevice(dev); }

  Status computeWaitsFor(int dev, void* event) noexcept override {
    EMU_TRY(useDevice(dev));
    std::lock_guard<std::mutex> lock(mutex_);
    if (!events_.count(static_cast<Event*>(event))) {
      return cat(cudaError("cudaStreamWaitEvent", dev, "invalid resource handle", "cudaErrorInvalidResourceHandle"),
                 " (emulator: not a live event from recordCommEvent)");
    }
    return {};  // nothing runs later on the emulated compute stream: there is nothing to order
  }

  Status computeWaitsForStream(int dev, uintptr_t stream) noexcept override {
    EMU_TRY(useDevice(dev));
    // 0 is not a valid __cuda_array_interface__ stream (the spec reserves it); anything else is a
    // foreign stream the emulator has nothing queued on.
    if (stream == 0) return cat("emulator: computeWaitsForStream got stream 0, which __cuda_array_interface__ forbids");
    return {};
  }

  Status recordCommEvent(int dev, void** event) noexcept override {
    *event = nullptr;
    EMU_TRY(useDevice(dev));
    auto* e = new (std::nothrow) Event;
    if (!e) return cudaError("cudaEventCreateWithFlags", dev, "out of memory", "cudaErrorMemoryAllocation");
    std::lock_guard<std::mutex> lock(mutex_);
    if (commBlocked_[dev] && !blocking(commBlocked_[dev])) commBlocked_[dev] = 0;
    e->blockedBy = commBlocked_[dev];  // the communication stream is stuck behind a hung collective
    events_.insert(e);
    *event = e;
    return {};
  }

  Status eventQuery(void* event, bool* done) noexcept override {
    *done = false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto* e = static_cast<Event*>(event);
    if (!events_.count(e)) {
      return cat(cudaError("cudaEventQuery", -1, "invalid resource handle", "cudaErrorInvalidResourceHandle"),
                 " (emulator: not a live event from recordCommEvent)");
    }
    *done = e->blockedBy == 0 || !blocking(e->blockedBy);
    return {};
  }

  void eventRelease(void* event) noexcept override {
    if (!event) return;
    auto* e = static_cast<Event*>(event);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!events_.erase(e)) {
        warn("eventRelease of an event that is not live (released twice?); ignored");
        return;
      }
    }
    delete e;
  }

  // ---- NCCL, world size 1 ----

  Status ncclUniqueId(std::string* id) noexcept override {
    std::string s = cat(kUniqueIdTag, nextCommId_.load());
    s.resize(kNcclUniqueIdBytes, '\0');
    *id = s;
    return {};
  }

  Status ncclInit(int dev, int nranks, int rank, const std::string& id, void** comm) noexcept override {
    *comm = nullptr;
    if (id.size() != kNcclUniqueIdBytes) {
      return cat("ncclInit on ", cudaDev(dev), ": the NCCL unique id has ", id.size(), " bytes, expected ",
                 kNcclUniqueIdBytes);
    }
    EMU_TRY(useDevice(dev));
    if (nranks != 1) return cat("emulator: NCCL is emulated for world size 1 only");
    if (rank != 0) {
      return cat("ncclCommInitRankConfig on ", cudaDev(dev), " failed: invalid argument (emulator: rank ", rank,
                 " of a 1-rank communicator)");
    }
    if (id.compare(0, sizeof kUniqueIdTag - 1, kUniqueIdTag) != 0) {
      return cat("ncclCommInitRankConfig on ", cudaDev(dev),
                 " failed: invalid argument (emulator: the unique id was not made by ncclUniqueId)");
    }
    auto* c = new (std::nothrow) Comm;
    if (!c) return cat("ncclCommInitRankConfig on ", cudaDev(dev), " failed: out of host memory");
    c->id = nextCommId_.fetch_add(1);
    c->dev = dev;
    c->nranks = nranks;
    c->rank = rank;
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.insert(c);
    *comm = c;
    return {};
  }

  Status ncclState(void* comm, bool* inProgress) noexcept override {
    *inProgress = false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto* c = static_cast<Comm*>(comm);
    if (!comms_.count(c)) return cat("ncclCommGetAsyncError failed: invalid argument (emulator: not a live communicator)");
    if (c->aborted) return cat("ncclCommGetAsyncError: remote process exited or there was a network error (emulated abort)");
    return {};
  }

  Status ncclCollective(void* comm, int dev, CollectiveKind kind, const void* send, void* recv, size_t count,
                        ElemType type, ReduceKind op, int root) noexcept override {
    const size_t item = elemBytes(type);
    if (!item) return cat("ncclCollective: unknown ElemType ", int(type));
    if (op != ReduceKind::Sum && op != ReduceKind::Avg && op != ReduceKind::Max && op != ReduceKind::Min &&
        op != ReduceKind::Product) {
      return cat("ncclCollective: unknown ReduceKind ", int(op));
    }
    EMU_TRY(useDevice(dev));
    const char* call;
    switch (kind) {
      case CollectiveKind::AllReduce: call = "ncclAllReduce"; break;
      case CollectiveKind::Broadcast: call = "ncclBroadcast"; break;
      case CollectiveKind::AllGather: call = "ncclAllGather"; break;
      case CollectiveKind::ReduceScatter: call = "ncclReduceScatter"; break;
      default: return cat("ncclCollective: unknown CollectiveKind ", int(kind));
    }
    uint64_t commId = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
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
    }
    // One rank: send holds count elements (nranks * count for ReduceScatter), recv count (nranks * count
    // for AllGather), and the reduction of a single contribution, whatever the op, is that contribution.
    const size_t bytes = count * item;
    const std::string who = cat("ncclCollective (", call, ")");
    EMU_TRY(deviceArg(who.c_str(), dev, send, bytes, "send"));
    EMU_TRY(deviceArg(who.c_str(), dev, recv, bytes, "recv"));
    const char* hang = std::getenv("CYXWIZ_EMULATED_NCCL_HANG");
    if (hang && std::strcmp(hang, "1") == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      commBlocked_[dev] = commId;  // this and every later event of dev's communication stream waits
      return {};
    }
    if (bytes && send != recv) std::memmove(recv, send, bytes);
    return {};
  }

  void ncclAbort(void* comm) noexcept override {
    if (!comm) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto* c = static_cast<Comm*>(comm);
    if (!comms_.count(c)) {
      warn("ncclAbort of a communicator that is not live; ignored");
      return;
    }
    c->aborted = true;  // its blocked work returns (events complete), as after ncclCommAbort
  }

  void ncclDestroy(void* comm) noexcept override {
    if (!comm) return;
    auto* c = static_cast<Comm*>(comm);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!comms_.erase(c)) {
        warn("ncclDestroy of a communicator that is not live (destroyed twice?); ignored");
        return;
      }
    }
    // ncclCommAbort frees the communicator in real NCCL: destroying an aborted one would be a double free.
    if (c->aborted) warn("ncclDestroy of an aborted communicator (real NCCL's ncclCommAbort already freed it)");
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
    if (count_ == 0) return cudaError(call, dev, "no CUDA-capable device is detected", "cudaErrorNoDevice");
    return cudaError(call, dev, "invalid device ordinal", "cudaErrorInvalidDevice");
  }

  // state.cpp's useDevice: the index check, then cudaSetDevice.
  Status useDevice(int dev) const {
    if (dev < 0 || dev >= kMaxDevices) return cat("cuda:", dev, " is not a valid device index");
    if (dev >= count_) return invalidDevice("cudaSetDevice", dev);
    return {};
  }

  static Status blasInvalid(int dev, const std::string& why) {
    return cat("cublasSgemm on ", cudaDev(dev), " failed: CUBLAS_STATUS_INVALID_VALUE (emulator: ", why, ")");
  }

  static Status unknownActivation(const char* who, int dev, Activation f) {
    return cat(who, " on ", cudaDev(dev), ": unknown Activation ", int(f));
  }

  static bool overlaps(const void* p, size_t pb, const void* q, size_t qb) {
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
    return a < b + qb && b < a + pb;
  }

  // Whether communicator `id` is live and not aborted (mutex_ held): its hung collective still blocks.
  bool blocking(uint64_t id) const {
    for (const Comm* c : comms_) {
      if (c->id == id) return !c->aborted;
    }
    return false;  // destroyed: ncclDestroy's finalize times out and aborts
  }

  // The live allocation containing ptr (a view may point inside one).
  bool lookup(const void* ptr, Found* out) const {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
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
  Status hostArg(const char* who, const void* ptr, const char* name) const {
    if (!ptr) return cat("emulator: ", who, " got a null pointer as host argument ", name);
    Found f;
    if (lookup(ptr, &f)) return cat("emulator: ", who, " got device memory of ", cudaDev(f.alloc.dev), " as host argument ", name);
    return {};
  }

  // The checks shared by the class-target methods; labels are range-checked where they index.
  Status classTargets(const char* who, int dev, const float* logits, const int64_t* labels, const float* probs,
                      int64_t rows, int64_t classes, bool labelsIndex) const {
    if (!labels && !probs) return cat(who, " on ", cudaDev(dev), ": neither labels nor probs was given");
    EMU_TRY(useDevice(dev));
    if (rows <= 0 || classes <= 0) return {};
    if (labels && probs) return cat("emulator: ", who, " got both labels and probs (api.h: the other is null)");
    EMU_TRY(deviceArg(who, dev, logits, f32(rows * classes), "logits"));
    if (labels) {
      EMU_TRY(deviceArg(who, dev, labels, i64(rows), "labels"));
      if (labelsIndex) {
        for (int64_t r = 0; r < rows; ++r) {
          if (labels[r] < 0 || labels[r] >= classes) {
            return cat("emulator: ", who, ": labels[", r, "] = ", labels[r], " is outside [0, ", classes,
                       ") (api.h: labels arrive range-checked)");
          }
        }
      }
    } else {
      EMU_TRY(deviceArg(who, dev, probs, f32(rows * classes), "probs"));
    }
    return {};
  }

  int count_ = 1;
  Status countError_;
  std::atomic<bool> tf32_{false};
  std::atomic<uint64_t> nextCommId_{1};

  mutable std::mutex mutex_;  // guards everything below
  std::map<uintptr_t, Alloc> allocs_;  // device memory: base -> (dev, bytes)
  std::map<uintptr_t, Alloc> pinned_;  // mallocHost memory, only to catch foreign or double freeHost
  std::set<Event*> events_;
  std::set<Comm*> comms_;
  uint64_t commBlocked_[kMaxDevices] = {};  // per device: the communicator of a hung collective, or 0
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
