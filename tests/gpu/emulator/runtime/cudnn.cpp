// TEST DOUBLE, NOT GPU SUPPORT. cuDNN's legacy convolution and pooling on the host, computed naively
// (direct loops, double accumulation) so that they are obviously right: float32 NCHW tensors,
// cross-correlation with padding, stride, dilation and groups (torch's conv2d), max pooling (NaN
// propagates with CUDNN_PROPAGATE_NAN; the gradient goes to the first maximum in window scan order,
// torch's rule) and average pooling with or without the padding counted. Every result is
// y = alpha * result + beta * y, y not read when beta == 0, as cuDNN's scaling parameters.
//
// Handles are bound to the device current at cudnnCreate and run on their stream (cudnnSetStream);
// each call is queued there like a kernel, declaring exactly the ranges it reads and writes, the
// workspace included (so a workspace freed too early is caught). The v7 heuristics offer one
// deterministic algorithm needing kWorkspaceBytes, and the calls refuse a smaller workspace. The
// searches (cudnnFindConvolution*Algorithm) do what the real ones do around their trial runs: cudaMalloc
// buffers of their own, run on the handle's stream, wait for it, cudaFree (so on a capturing stream
// they fail, and the capture is invalidated, as a real search would make it); they then report fake
// times, fastest first, in which the fastest deterministic algorithm is not the heuristic's (and, for
// the backward passes, a faster non-deterministic one comes first), so a test can tell which way an
// algorithm was chosen. Every algorithm computes the same naive loops. A math
// type other than CUDNN_FMA_MATH rounds the inputs to TF32 (10-bit mantissa), as tensor cores do on
// the emulated capability 9.0 devices. Bad arguments: CUDNN_STATUS_BAD_PARAM with an "emulator:"
// line (also cudnnGetLastErrorString's message); what is not emulated (other layouts and data types,
// CUDNN_CONVOLUTION): CUDNN_STATUS_NOT_SUPPORTED.
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "internal.h"

struct cudnnContext {
  int dev = 0;
  cudaStream_t stream = nullptr;
};

struct cudnnTensorStruct {
  bool set = false;
  int n = 0, c = 0, h = 0, w = 0;
};

struct cudnnFilterStruct {
  bool set = false;
  int k = 0, c = 0, h = 0, w = 0;
};

struct cudnnConvolutionStruct {
  bool set = false;
  int ph = 0, pw = 0, sh = 1, sw = 1, dh = 1, dw = 1;
  int groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // cuDNN's default
};

struct cudnnPoolingStruct {
  bool set = false;
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  bool propagateNan = false;
  int kh = 0, kw = 0, ph = 0, pw = 0, sh = 1, sw = 1;
};

namespace cxemu {

namespace {

// What every emulated algorithm asks for: nonzero, so that the caller's workspace path runs.
constexpr size_t kWorkspaceBytes = 1024;

// For the test hooks: the algorithm the last convolution call of each pass received (0 forward, 1
// backward data, 2 backward filter; -1 none yet), and the searches made (refused ones included).
std::atomic<int> gLastAlgo[3] = {{-1}, {-1}, {-1}};
std::atomic<int> gSearches{0};

thread_local std::string tLastError;  // cudnnGetLastErrorString's

cudnnStatus_t refuse(cudnnStatus_t st, const std::string& why) {
  tLastError = why;
  say(why);
  return st;
}

cudnnStatus_t bad(const char* call, const std::string& why) {
  return refuse(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": " + why);
}

cudnnStatus_t notEmulated(const char* call, const std::string& what) {
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": not emulated: " + what);
}

float roundTf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // round to nearest (ties away), finite values only
  u &= 0xffffe000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

// out = alpha * r + beta * out; out not read when beta == 0.
void store(float* out, double r, float alpha, float beta) {
  const double v = double(alpha) * r;
  *out = static_cast<float>(beta == 0.0f ? v : v + double(beta) * double(*out));
}

int64_t count(const cudnnTensorStruct& t) { return int64_t(t.n) * t.c * t.h * t.w; }

std::string dims(int n, int c, int h, int w) {
  return "(" + std::to_string(n) + ", " + std::to_string(c) + ", " + std::to_string(h) + ", " + std::to_string(w) + ")";
}

// A convolution's sizes, copied into the queued work (the descriptors may change after the call).
struct Conv {
  int n, c, h, w;     // x
  int k, cg, kh, kw;  // weight (k, c / groups, kh, kw)
  int oh, ow;         // y (n, k, oh, ow)
  int ph, pw, sh, sw, dh, dw, groups;
  bool tf32;
  int64_t xCount() const { return int64_t(n) * c * h * w; }
  int64_t wCount() const { return int64_t(k) * cg * kh * kw; }
  int64_t yCount() const { return int64_t(n) * k * oh * ow; }
  int64_t xAt(int i, int ch, int y, int x) const { return ((int64_t(i) * c + ch) * h + y) * w + x; }
  int64_t wAt(int o, int ci, int y, int x) const { return ((int64_t(o) * cg + ci) * kh + y) * kw + x; }
  int64_t yAt(int i, int o, int y, int x) const { return ((int64_t(i) * k + o) * oh + y) * ow + x; }
  float in(float v) const { return tf32 ? roundTf32(v) : v; }
};

// (in + 2 pad - dilation (window - 1) - 1) / stride + 1, or -1 when the window does not fit.
int outSize(int in, int pad, int dilation, int window, int stride) {
  const int64_t span = int64_t(in) + 2 * int64_t(pad) - int64_t(dilation) * (window - 1) - 1;
  return span < 0 ? -1 : int(span / stride + 1);
}

cudnnStatus_t convOutput(const char* call, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                         const cudnnConvolutionStruct* conv, cudnnTensorStruct* out) {
  if (!x || !w || !conv || !x->set || !w->set || !conv->set) return bad(call, "a descriptor is null or not set");
  if (x->c != w->c * conv->groups || w->k % conv->groups != 0) {
    return bad(call, "input " + dims(x->n, x->c, x->h, x->w) + ", filter " + dims(w->k, w->c, w->h, w->w) +
                         " and groups " + std::to_string(conv->groups) + " do not match");
  }
  const int oh = outSize(x->h, conv->ph, conv->dh, w->h, conv->sh), ow = outSize(x->w, conv->pw, conv->dw, w->w, conv->sw);
  if (oh <= 0 || ow <= 0) return bad(call, "the dilated filter does not fit the padded input");
  *out = cudnnTensorStruct{true, x->n, w->k, oh, ow};
  return CUDNN_STATUS_SUCCESS;
}

// The checks of every convolution call: consistent descriptors, y's shape the convolution's.
cudnnStatus_t convCheck(const char* call, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                        const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y, Conv* g) {
  cudnnTensorStruct expect;
  if (cudnnStatus_t st = convOutput(call, x, w, conv, &expect)) return st;
  if (!y || !y->set) return bad(call, "the output descriptor is null or not set");
  if (y->n != expect.n || y->c != expect.c || y->h != expect.h || y->w != expect.w) {
    return bad(call, "output " + dims(y->n, y->c, y->h, y->w) + " is not the convolution's " +
                         dims(expect.n, expect.c, expect.h, expect.w));
  }
  *g = Conv{x->n, x->c, x->h, x->w, w->k, w->c, w->h, w->w, y->h, y->w,
            conv->ph, conv->pw, conv->sh, conv->sw, conv->dh, conv->dw, conv->groups, conv->math != CUDNN_FMA_MATH};
  return CUDNN_STATUS_SUCCESS;
}

// What a convolution call checks beyond the shapes: handle, scalars, pointers, algorithm, workspace.
cudnnStatus_t callCheck(const char* call, cudnnHandle_t h, const void* alpha, const void* beta,
                        std::initializer_list<const void*> data, int algo, int algoCount, const void* workspace,
                        size_t workspaceBytes) {
  if (!h) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (!alpha || !beta) return bad(call, "alpha or beta is null");
  for (const void* p : data) {
    if (!p) return bad(call, "a data pointer is null");
  }
  if (algo < 0 || algo >= algoCount) return bad(call, "algorithm " + std::to_string(algo) + " out of range");
  if (!workspace || workspaceBytes < kWorkspaceBytes) {
    return bad(call, "the workspace (" + std::to_string(workspaceBytes) + " bytes) is smaller than the " +
                         std::to_string(kWorkspaceBytes) + " the algorithm needs");
  }
  return CUDNN_STATUS_SUCCESS;
}

// Queues `work` on the handle's stream like a kernel.
cudnnStatus_t run(cudnnHandle_t h, const char* call, std::vector<Access> accesses, std::function<void()> work) {
  const cudaError_t e = enqueue(h->stream, call, std::move(accesses), std::move(work));
  if (e == cudaSuccess) return CUDNN_STATUS_SUCCESS;
  tLastError = std::string(call) + ": the launch failed: " + cudaGetErrorString(e);
  return CUDNN_STATUS_EXECUTION_FAILED;
}

template <class T>
Access reads(const void* p, int64_t n) {
  return Access{p, size_t(n) * sizeof(T), false};
}

template <class T>
Access writes(const void* p, int64_t n) {
  return Access{p, size_t(n) * sizeof(T), true};
}

Access scratch(void* workspace) { return Access{workspace, kWorkspaceBytes, true}; }

// ---- the math ----

void convForwardHost(const Conv& g, float alpha, const float* x, const float* w, float beta, float* y) {
  const int kg = g.k / g.groups;  // output channels per group
  for (int i = 0; i < g.n; ++i) {
    for (int o = 0; o < g.k; ++o) {
      const int first = (o / kg) * g.cg;  // the group's first input channel
      for (int oy = 0; oy < g.oh; ++oy) {
        for (int ox = 0; ox < g.ow; ++ox) {
          double acc = 0.0;
          for (int ci = 0; ci < g.cg; ++ci) {
            for (int ky = 0; ky < g.kh; ++ky) {
              const int iy = oy * g.sh - g.ph + ky * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (int kx = 0; kx < g.kw; ++kx) {
                const int ix = ox * g.sw - g.pw + kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                acc += double(g.in(x[g.xAt(i, first + ci, iy, ix)])) * double(g.in(w[g.wAt(o, ci, ky, kx)]));
              }
            }
          }
          store(&y[g.yAt(i, o, oy, ox)], acc, alpha, beta);
        }
      }
    }
  }
}

// Every (output, filter tap) pair whose input position is inside the image, as f(i, o, oy, ox, ci, ky,
// kx, input index): the one loop nest both backward passes scatter or gather over.
template <class F>
void forEachTap(const Conv& g, F f) {
  const int kg = g.k / g.groups;
  for (int i = 0; i < g.n; ++i) {
    for (int o = 0; o < g.k; ++o) {
      const int first = (o / kg) * g.cg;
      for (int oy = 0; oy < g.oh; ++oy) {
        for (int ox = 0; ox < g.ow; ++ox) {
          for (int ci = 0; ci < g.cg; ++ci) {
            for (int ky = 0; ky < g.kh; ++ky) {
              const int iy = oy * g.sh - g.ph + ky * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (int kx = 0; kx < g.kw; ++kx) {
                const int ix = ox * g.sw - g.pw + kx * g.dw;
                if (ix < 0 || ix >= g.w) continue;
                f(g.yAt(i, o, oy, ox), g.wAt(o, ci, ky, kx), g.xAt(i, first + ci, iy, ix));
              }
            }
          }
        }
      }
    }
  }
}

void convBackwardDataHost(const Conv& g, float alpha, const float* w, const float* dy, float beta, float* dx) {
  std::vector<double> acc(size_t(g.xCount()), 0.0);
  forEachTap(g, [&](int64_t yi, int64_t wi, int64_t xi) { acc[xi] += double(g.in(dy[yi])) * double(g.in(w[wi])); });
  for (int64_t i = 0; i < g.xCount(); ++i) store(&dx[i], acc[i], alpha, beta);
}

void convBackwardFilterHost(const Conv& g, float alpha, const float* x, const float* dy, float beta, float* dw) {
  std::vector<double> acc(size_t(g.wCount()), 0.0);
  forEachTap(g, [&](int64_t yi, int64_t wi, int64_t xi) { acc[wi] += double(g.in(dy[yi])) * double(g.in(x[xi])); });
  for (int64_t i = 0; i < g.wCount(); ++i) store(&dw[i], acc[i], alpha, beta);
}

struct Pool {
  int n, c, h, w, oh, ow;
  int kh, kw, ph, pw, sh, sw;
  cudnnPoolingMode_t mode;
  bool propagateNan;
  bool max() const { return mode == CUDNN_POOLING_MAX || mode == CUDNN_POOLING_MAX_DETERMINISTIC; }
};

// One output's window, clipped to the image: rows [y0, y1), columns [x0, x1) of plane p.
struct Window {
  int y0, y1, x0, x1;
};

Window windowOf(const Pool& g, int oy, int ox) {
  const int ys = oy * g.sh - g.ph, xs = ox * g.sw - g.pw;
  return Window{std::max(ys, 0), std::min(ys + g.kh, g.h), std::max(xs, 0), std::min(xs + g.kw, g.w)};
}

// Max pooling's choice in one window of `plane`: torch's rule, the first maximum in scan order (a
// larger value replaces it; with NaN propagation any NaN does too). -1 for an empty window.
int64_t argmaxOf(const Pool& g, const float* plane, const Window& win) {
  int64_t at = -1;
  float best = -std::numeric_limits<float>::infinity();
  for (int y = win.y0; y < win.y1; ++y) {
    for (int x = win.x0; x < win.x1; ++x) {
      const float v = plane[int64_t(y) * g.w + x];
      if (at < 0) at = int64_t(y) * g.w + x;  // the first position inside the image, if nothing beats -inf
      if (v > best || (g.propagateNan && std::isnan(v))) {
        best = v;
        at = int64_t(y) * g.w + x;
      }
    }
  }
  return at;
}

double divisorOf(const Pool& g, const Window& win) {
  if (g.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING) return double(g.kh) * g.kw;
  return double(std::max(0, win.y1 - win.y0)) * std::max(0, win.x1 - win.x0);
}

void poolForwardHost(const Pool& g, float alpha, const float* x, float beta, float* y) {
  for (int64_t p = 0; p < int64_t(g.n) * g.c; ++p) {
    const float* plane = x + p * g.h * g.w;
    for (int oy = 0; oy < g.oh; ++oy) {
      for (int ox = 0; ox < g.ow; ++ox) {
        const Window win = windowOf(g, oy, ox);
        double r = 0.0;
        if (g.max()) {
          const int64_t at = argmaxOf(g, plane, win);
          r = at < 0 ? -std::numeric_limits<double>::infinity() : double(plane[at]);
        } else {
          for (int yy = win.y0; yy < win.y1; ++yy) {
            for (int xx = win.x0; xx < win.x1; ++xx) r += plane[int64_t(yy) * g.w + xx];
          }
          const double d = divisorOf(g, win);
          r = d > 0 ? r / d : 0.0;
        }
        store(&y[(p * g.oh + oy) * g.ow + ox], r, alpha, beta);
      }
    }
  }
}

void poolBackwardHost(const Pool& g, float alpha, const float* dy, const float* x, float beta, float* dx) {
  std::vector<double> acc(size_t(int64_t(g.n) * g.c * g.h * g.w), 0.0);
  for (int64_t p = 0; p < int64_t(g.n) * g.c; ++p) {
    const float* plane = x + p * g.h * g.w;
    double* out = acc.data() + p * g.h * g.w;
    for (int oy = 0; oy < g.oh; ++oy) {
      for (int ox = 0; ox < g.ow; ++ox) {
        const Window win = windowOf(g, oy, ox);
        const double d = dy[(p * g.oh + oy) * g.ow + ox];
        if (g.max()) {
          const int64_t at = argmaxOf(g, plane, win);
          if (at >= 0) out[at] += d;
        } else {
          const double div = divisorOf(g, win);
          if (div <= 0) continue;
          for (int yy = win.y0; yy < win.y1; ++yy) {
            for (int xx = win.x0; xx < win.x1; ++xx) out[int64_t(yy) * g.w + xx] += d / div;
          }
        }
      }
    }
  }
  for (size_t i = 0; i < acc.size(); ++i) store(&dx[i], acc[i], alpha, beta);
}

cudnnStatus_t poolOutput(const char* call, const cudnnPoolingStruct* pool, const cudnnTensorStruct* x,
                         cudnnTensorStruct* out) {
  if (!pool || !x || !pool->set || !x->set) return bad(call, "a descriptor is null or not set");
  const int oh = outSize(x->h, pool->ph, 1, pool->kh, pool->sh), ow = outSize(x->w, pool->pw, 1, pool->kw, pool->sw);
  if (oh <= 0 || ow <= 0) return bad(call, "the window does not fit the padded input");
  *out = cudnnTensorStruct{true, x->n, x->c, oh, ow};
  return CUDNN_STATUS_SUCCESS;
}

bool sameDims(const cudnnTensorStruct* a, const cudnnTensorStruct* b) {
  return a && b && a->set && b->set && a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w;
}

cudnnStatus_t poolCheck(const char* call, const cudnnPoolingStruct* pool, const cudnnTensorStruct* x,
                        const cudnnTensorStruct* y, Pool* g) {
  cudnnTensorStruct expect;
  if (cudnnStatus_t st = poolOutput(call, pool, x, &expect)) return st;
  if (!sameDims(y, &expect)) {
    return bad(call, std::string("output ") + (y && y->set ? dims(y->n, y->c, y->h, y->w) : "(not set)") +
                         " is not the pooling's " + dims(expect.n, expect.c, expect.h, expect.w));
  }
  *g = Pool{x->n, x->c, x->h, x->w, y->h, y->w, pool->kh, pool->kw, pool->ph, pool->pw, pool->sh, pool->sw,
            pool->mode, pool->propagateNan};
  return CUDNN_STATUS_SUCCESS;
}

// Descriptor creation and destruction, the same for every kind.
template <class T>
cudnnStatus_t create(T** out) {
  if (!out) return CUDNN_STATUS_BAD_PARAM;
  *out = new T;
  return CUDNN_STATUS_SUCCESS;
}

template <class T>
cudnnStatus_t destroy(T* p) {
  delete p;  // queued work copied what it needs
  return CUDNN_STATUS_SUCCESS;
}

bool validDims(int n, int c, int h, int w) { return n > 0 && c > 0 && h > 0 && w > 0; }

}  // namespace

}  // namespace cxemu

using namespace cxemu;

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED: return "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED: return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED_CUDART: return "CUDNN_STATUS_EXECUTION_FAILED_CUDART";
  }
  return "CUDNN_UNKNOWN_STATUS_FOUND";
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  const size_t n = std::min(tLastError.size(), max_size - 1);
  std::memcpy(message, tLastError.data(), n);
  message[n] = '\0';
  tLastError.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return bad("cudnnCreate", "handle is null");
  *handle = nullptr;
  const int dev = currentDevice();
  if (deviceError(dev) != cudaSuccess || stickyError(dev) != cudaSuccess) {
    return refuse(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate: cuda:" + std::to_string(dev) + " is not usable");
  }
  auto* h = new cudnnContext;
  h->dev = dev;
  *handle = h;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  delete handle;  // queued calls captured their arguments, not the handle
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  if (!handle) return bad("cudnnSetStream", "null handle");
  const int dev = streamDevice(streamId);
  if (dev < 0) return bad("cudnnSetStream", "not a live stream");
  if (dev != handle->dev) {
    return refuse(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH, "cudnnSetStream: a stream of cuda:" + std::to_string(dev) +
                                                              " for a handle of cuda:" + std::to_string(handle->dev));
  }
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

// ---- descriptors ----

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) { return create(d); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) { return destroy(d); }
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) { return create(d); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { return destroy(d); }
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) { return create(d); }
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) { return destroy(d); }
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* d) { return create(d); }
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) { return destroy(d); }

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
  const char* call = "cudnnSetTensor4dDescriptor";
  if (!d) return bad(call, "null descriptor");
  if (!validDims(n, c, h, w)) return bad(call, "dimensions " + dims(n, c, h, w) + " must be positive");
  if (format != CUDNN_TENSOR_NCHW) return notEmulated(call, "a format other than CUDNN_TENSOR_NCHW");
  if (dataType != CUDNN_DATA_FLOAT) return notEmulated(call, "a data type other than CUDNN_DATA_FLOAT");
  *d = cudnnTensorStruct{true, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  const char* call = "cudnnSetFilter4dDescriptor";
  if (!d) return bad(call, "null descriptor");
  if (!validDims(k, c, h, w)) return bad(call, "dimensions " + dims(k, c, h, w) + " must be positive");
  if (format != CUDNN_TENSOR_NCHW) return notEmulated(call, "a format other than CUDNN_TENSOR_NCHW");
  if (dataType != CUDNN_DATA_FLOAT) return notEmulated(call, "a data type other than CUDNN_DATA_FLOAT");
  *d = cudnnFilterStruct{true, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
  const char* call = "cudnnSetConvolution2dDescriptor";
  if (!d) return bad(call, "null descriptor");
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0) {
    return bad(call, "negative padding, or a stride or dilation that is not positive");
  }
  if (mode != CUDNN_CROSS_CORRELATION && mode != CUDNN_CONVOLUTION) return bad(call, "unknown mode");
  if (mode != CUDNN_CROSS_CORRELATION) return notEmulated(call, "CUDNN_CONVOLUTION (flipped filters)");
  if (computeType != CUDNN_DATA_FLOAT) return notEmulated(call, "a compute type other than CUDNN_DATA_FLOAT");
  d->set = true;  // the group count and math type stay as set
  d->ph = pad_h;
  d->pw = pad_w;
  d->sh = u;
  d->sw = v;
  d->dh = dilation_h;
  d->dw = dilation_w;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groupCount) {
  if (!d || groupCount < 1) return bad("cudnnSetConvolutionGroupCount", "null descriptor or groupCount < 1");
  d->groups = groupCount;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t mathType) {
  if (!d || mathType < CUDNN_DEFAULT_MATH || mathType > CUDNN_FMA_MATH) {
    return bad("cudnnSetConvolutionMathType", "null descriptor or unknown math type");
  }
  d->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int* n, int* c, int* h,
                                                    int* w) {
  const char* call = "cudnnGetConvolution2dForwardOutputDim";
  if (!n || !c || !h || !w) return bad(call, "a null output");
  cudnnTensorStruct out;
  if (cudnnStatus_t st = convOutput(call, inputTensorDesc, filterDesc, convDesc, &out)) return st;
  *n = out.n;
  *c = out.c;
  *h = out.h;
  *w = out.w;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight, int windowWidth,
                                          int verticalPadding, int horizontalPadding, int verticalStride,
                                          int horizontalStride) {
  const char* call = "cudnnSetPooling2dDescriptor";
  if (!d) return bad(call, "null descriptor");
  if (mode < CUDNN_POOLING_MAX || mode > CUDNN_POOLING_MAX_DETERMINISTIC) return bad(call, "unknown mode");
  if (maxpoolingNanOpt != CUDNN_NOT_PROPAGATE_NAN && maxpoolingNanOpt != CUDNN_PROPAGATE_NAN) {
    return bad(call, "unknown NaN propagation");
  }
  if (windowHeight <= 0 || windowWidth <= 0 || verticalPadding < 0 || horizontalPadding < 0 || verticalStride <= 0 ||
      horizontalStride <= 0) {
    return bad(call, "a window or stride that is not positive, or negative padding");
  }
  *d = cudnnPoolingStruct{true,           mode,          maxpoolingNanOpt == CUDNN_PROPAGATE_NAN, windowHeight,
                          windowWidth,    verticalPadding, horizontalPadding,                     verticalStride,
                          horizontalStride};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t poolingDesc,
                                                const cudnnTensorDescriptor_t inputTensorDesc, int* n, int* c, int* h,
                                                int* w) {
  const char* call = "cudnnGetPooling2dForwardOutputDim";
  if (!n || !c || !h || !w) return bad(call, "a null output");
  cudnnTensorStruct out;
  if (cudnnStatus_t st = poolOutput(call, poolingDesc, inputTensorDesc, &out)) return st;
  *n = out.n;
  *c = out.c;
  *h = out.h;
  *w = out.w;
  return CUDNN_STATUS_SUCCESS;
}

// ---- algorithm queries: one deterministic algorithm with kWorkspaceBytes of workspace ----

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!handle || !count) return bad("cudnnGetConvolutionForwardAlgorithmMaxCount", "null handle or count");
  *count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!handle || !count) return bad("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", "null handle or count");
  *count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!handle || !count) return bad("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", "null handle or count");
  *count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"

namespace {

template <class Perf, class Algo>
cudnnStatus_t offerOne(const char* call, cudnnHandle_t handle, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                       const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y, int requested, int* returned,
                       Perf* perfs, Algo algo) {
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (requested < 1 || !returned || !perfs) return bad(call, "requestedAlgoCount < 1 or a null output");
  Conv g;
  if (cudnnStatus_t st = convCheck(call, x, w, conv, y, &g)) return st;
  Perf p;
  std::memset(&p, 0, sizeof p);
  p.algo = algo;
  p.status = CUDNN_STATUS_SUCCESS;
  p.time = -1.0f;  // a heuristic, not a measurement
  p.memory = kWorkspaceBytes;
  p.determinism = CUDNN_DETERMINISTIC;
  p.mathType = conv->math;
  perfs[0] = p;
  *returned = 1;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspaceOf(const char* call, cudnnHandle_t handle, const cudnnTensorStruct* x,
                          const cudnnFilterStruct* w, const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y,
                          int algo, int algoCount, size_t* bytes) {
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (!bytes) return bad(call, "sizeInBytes is null");
  Conv g;
  if (cudnnStatus_t st = convCheck(call, x, w, conv, y, &g)) return st;
  if (algo < 0 || algo >= algoCount) return bad(call, "algorithm " + std::to_string(algo) + " out of range");
  *bytes = kWorkspaceBytes;
  return CUDNN_STATUS_SUCCESS;
}

template <class Algo>
struct Trial {
  Algo algo;
  float ms;
  cudnnDeterminism_t determinism;
};

// A search: the checks, cuDNN's own buffers (x, w, y and a workspace) from cudaMalloc, the trial runs
// on the handle's stream (they touch only those buffers), a wait for them, cudaFree; then `trials`
// (given fastest first) as the results. CYXWIZ_EMULATED_CUDNN_FIND_FAIL=1 (read at each search): it
// fails as if its buffers did not fit in memory, leaving cudaErrorMemoryAllocation as the thread's
// last error, as the failed cudaMalloc inside a real cuDNN would.
template <class Perf, class Algo>
cudnnStatus_t search(const char* call, cudnnHandle_t handle, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                     const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y, int requested, int* returned,
                     Perf* perfs, std::initializer_list<Trial<Algo>> trials) {
  ++gSearches;
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (requested < 1 || !returned || !perfs) return bad(call, "requestedAlgoCount < 1 or a null output");
  Conv g;
  if (cudnnStatus_t st = convCheck(call, x, w, conv, y, &g)) return st;
  if (envInt("CYXWIZ_EMULATED_CUDNN_FIND_FAIL", 0, 0, 1)) {
    setLastError(cudaErrorMemoryAllocation);
    return refuse(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED,
                  std::string(call) + ": its buffers do not fit in memory (CYXWIZ_EMULATED_CUDNN_FIND_FAIL=1)");
  }
  const size_t bytes = size_t(g.xCount() + g.wCount() + g.yCount()) * sizeof(float) + kWorkspaceBytes;
  void* buffers = nullptr;
  cudaError_t e = cudaMalloc(&buffers, bytes);
  if (e != cudaSuccess) {
    return refuse(CUDNN_STATUS_EXECUTION_FAILED_CUDART,
                  std::string(call) + ": cudaMalloc of its buffers failed: " + cudaGetErrorName(e));
  }
  e = enqueue(handle->stream, call, {Access{buffers, bytes, true}}, [] {});
  if (e == cudaSuccess) e = cudaStreamSynchronize(handle->stream);
  cudaFree(buffers);
  if (e != cudaSuccess) {
    return refuse(CUDNN_STATUS_EXECUTION_FAILED_CUDART,
                  std::string(call) + ": the trial runs failed: " + cudaGetErrorName(e));
  }
  int n = 0;
  for (const Trial<Algo>& t : trials) {
    if (n == requested) break;
    Perf p;
    std::memset(&p, 0, sizeof p);
    p.algo = t.algo;
    p.status = CUDNN_STATUS_SUCCESS;
    p.time = t.ms;
    p.memory = kWorkspaceBytes;
    p.determinism = t.determinism;
    p.mathType = conv->math;
    perfs[n++] = p;
  }
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  return offerOne("cudnnGetConvolutionForwardAlgorithm_v7", handle, srcDesc, filterDesc, convDesc, destDesc,
                  requestedAlgoCount, returnedAlgoCount, perfResults, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle,
                                                          const cudnnFilterDescriptor_t filterDesc,
                                                          const cudnnTensorDescriptor_t diffDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t gradDesc,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  return offerOne("cudnnGetConvolutionBackwardDataAlgorithm_v7", handle, gradDesc, filterDesc, convDesc, diffDesc,
                  requestedAlgoCount, returnedAlgoCount, perfResults, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  return offerOne("cudnnGetConvolutionBackwardFilterAlgorithm_v7", handle, srcDesc, gradDesc, convDesc, diffDesc,
                  requestedAlgoCount, returnedAlgoCount, perfResults, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
}

// The searches: fastest deterministic not the heuristic's (IMPLICIT_GEMM, BWD_DATA_ALGO_1,
// BWD_FILTER_ALGO_1), and for the backward passes a faster non-deterministic ALGO_0 first.

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                   const cudnnFilterDescriptor_t wDesc,
                                                   const cudnnConvolutionDescriptor_t convDesc,
                                                   const cudnnTensorDescriptor_t yDesc, const int requestedAlgoCount,
                                                   int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  return search<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      "cudnnFindConvolutionForwardAlgorithm", handle, xDesc, wDesc, convDesc, yDesc, requestedAlgoCount,
      returnedAlgoCount, perfResults,
      {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 0.5f, CUDNN_DETERMINISTIC},
       {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 1.0f, CUDNN_DETERMINISTIC}});
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                        const cudnnTensorDescriptor_t dyDesc,
                                                        const cudnnConvolutionDescriptor_t convDesc,
                                                        const cudnnTensorDescriptor_t dxDesc,
                                                        const int requestedAlgoCount, int* returnedAlgoCount,
                                                        cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  return search<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      "cudnnFindConvolutionBackwardDataAlgorithm", handle, dxDesc, wDesc, convDesc, dyDesc, requestedAlgoCount,
      returnedAlgoCount, perfResults,
      {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, 0.25f, CUDNN_NON_DETERMINISTIC},
       {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, 0.5f, CUDNN_DETERMINISTIC},
       {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, 1.0f, CUDNN_DETERMINISTIC}});
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                          const cudnnTensorDescriptor_t dyDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnFilterDescriptor_t dwDesc,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  return search<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      "cudnnFindConvolutionBackwardFilterAlgorithm", handle, xDesc, dwDesc, convDesc, dyDesc, requestedAlgoCount,
      returnedAlgoCount, perfResults,
      {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, 0.25f, CUDNN_NON_DETERMINISTIC},
       {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, 0.5f, CUDNN_DETERMINISTIC},
       {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, 1.0f, CUDNN_DETERMINISTIC}});
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  return workspaceOf("cudnnGetConvolutionForwardWorkspaceSize", handle, xDesc, wDesc, convDesc, yDesc, algo,
                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  return workspaceOf("cudnnGetConvolutionBackwardDataWorkspaceSize", handle, dxDesc, wDesc, convDesc, dyDesc, algo,
                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle,
                                                             const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t* sizeInBytes) {
  return workspaceOf("cudnnGetConvolutionBackwardFilterWorkspaceSize", handle, xDesc, gradDesc, convDesc, dyDesc, algo,
                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, sizeInBytes);
}

// ---- the computations ----

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y) {
  const char* call = "cudnnConvolutionForward";
  if (cudnnStatus_t st = callCheck(call, handle, alpha, beta, {x, w, y}, algo, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                   workSpace, workSpaceSizeInBytes)) {
    return st;
  }
  gLastAlgo[0] = int(algo);
  Conv g;
  if (cudnnStatus_t st = convCheck(call, xDesc, wDesc, convDesc, yDesc, &g)) return st;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* xp = static_cast<const float*>(x);
  const auto* wp = static_cast<const float*>(w);
  auto* yp = static_cast<float*>(y);
  return run(handle, call,
             {reads<float>(x, g.xCount()), reads<float>(w, g.wCount()), writes<float>(y, g.yCount()), scratch(workSpace)},
             [=] {
               std::memset(workSpace, 0, kWorkspaceBytes);  // the algorithm's use of it
               convForwardHost(g, a, xp, wp, b, yp);
             });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           const cudnnFilterDescriptor_t wDesc, const void* w,
                                           const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                           size_t workSpaceSizeInBytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxDesc, void* dx) {
  const char* call = "cudnnConvolutionBackwardData";
  if (cudnnStatus_t st = callCheck(call, handle, alpha, beta, {w, dy, dx}, algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                   workSpace, workSpaceSizeInBytes)) {
    return st;
  }
  gLastAlgo[1] = int(algo);
  Conv g;
  if (cudnnStatus_t st = convCheck(call, dxDesc, wDesc, convDesc, dyDesc, &g)) return st;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* wp = static_cast<const float*>(w);
  const auto* dyp = static_cast<const float*>(dy);
  auto* dxp = static_cast<float*>(dx);
  return run(handle, call,
             {reads<float>(w, g.wCount()), reads<float>(dy, g.yCount()), writes<float>(dx, g.xCount()),
              scratch(workSpace)},
             [=] {
               std::memset(workSpace, 0, kWorkspaceBytes);
               convBackwardDataHost(g, a, wp, dyp, b, dxp);
             });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                             size_t workSpaceSizeInBytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwDesc, void* dw) {
  const char* call = "cudnnConvolutionBackwardFilter";
  if (cudnnStatus_t st = callCheck(call, handle, alpha, beta, {x, dy, dw}, algo,
                                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, workSpace, workSpaceSizeInBytes)) {
    return st;
  }
  gLastAlgo[2] = int(algo);
  Conv g;
  if (cudnnStatus_t st = convCheck(call, xDesc, dwDesc, convDesc, dyDesc, &g)) return st;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* xp = static_cast<const float*>(x);
  const auto* dyp = static_cast<const float*>(dy);
  auto* dwp = static_cast<float*>(dw);
  return run(handle, call,
             {reads<float>(x, g.xCount()), reads<float>(dy, g.yCount()), writes<float>(dw, g.wCount()),
              scratch(workSpace)},
             [=] {
               std::memset(workSpace, 0, kWorkspaceBytes);
               convBackwardFilterHost(g, a, xp, dyp, b, dwp);
             });
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void* alpha,
                                           const cudnnTensorDescriptor_t dyDesc, const void* dy, const void* beta,
                                           const cudnnTensorDescriptor_t dbDesc, void* db) {
  const char* call = "cudnnConvolutionBackwardBias";
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (!alpha || !beta || !dy || !db) return bad(call, "a null scalar or data pointer");
  if (!dyDesc || !dbDesc || !dyDesc->set || !dbDesc->set) return bad(call, "a descriptor is null or not set");
  if (dbDesc->n != 1 || dbDesc->c != dyDesc->c || dbDesc->h != 1 || dbDesc->w != 1) {
    return bad(call, "db " + dims(dbDesc->n, dbDesc->c, dbDesc->h, dbDesc->w) + " is not (1, C, 1, 1) for dy " +
                         dims(dyDesc->n, dyDesc->c, dyDesc->h, dyDesc->w));
  }
  const cudnnTensorStruct t = *dyDesc;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* dyp = static_cast<const float*>(dy);
  auto* dbp = static_cast<float*>(db);
  return run(handle, call, {reads<float>(dy, count(t)), writes<float>(db, t.c)}, [=] {
    for (int ch = 0; ch < t.c; ++ch) {
      double acc = 0.0;
      for (int i = 0; i < t.n; ++i) {
        const float* plane = dyp + (int64_t(i) * t.c + ch) * t.h * t.w;
        for (int64_t j = 0; j < int64_t(t.h) * t.w; ++j) acc += plane[j];
      }
      store(&dbp[ch], acc, a, b);
    }
  });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t aDesc,
                             const void* A, const void* beta, const cudnnTensorDescriptor_t cDesc, void* C) {
  const char* call = "cudnnAddTensor";
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (!alpha || !beta || !A || !C) return bad(call, "a null scalar or data pointer");
  if (!aDesc || !cDesc || !aDesc->set || !cDesc->set) return bad(call, "a descriptor is null or not set");
  const cudnnTensorStruct ta = *aDesc, tc = *cDesc;
  // Each of A's dimensions is 1 (broadcast) or C's.
  auto fits = [](int a, int c) { return a == 1 || a == c; };
  if (!fits(ta.n, tc.n) || !fits(ta.c, tc.c) || !fits(ta.h, tc.h) || !fits(ta.w, tc.w)) {
    return bad(call, "A " + dims(ta.n, ta.c, ta.h, ta.w) + " does not broadcast to C " + dims(tc.n, tc.c, tc.h, tc.w));
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* ap = static_cast<const float*>(A);
  auto* cp = static_cast<float*>(C);
  return run(handle, call, {reads<float>(A, count(ta)), writes<float>(C, count(tc))}, [=] {
    for (int i = 0; i < tc.n; ++i) {
      for (int ch = 0; ch < tc.c; ++ch) {
        for (int y = 0; y < tc.h; ++y) {
          for (int x = 0; x < tc.w; ++x) {
            const int64_t ai = ((int64_t(i % ta.n) * ta.c + ch % ta.c) * ta.h + y % ta.h) * ta.w + x % ta.w;
            const int64_t ci = ((int64_t(i) * tc.c + ch) * tc.h + y) * tc.w + x;
            store(&cp[ci], ap[ai], a, b);
          }
        }
      }
    }
  });
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc, const void* alpha,
                                  const cudnnTensorDescriptor_t xDesc, const void* x, const void* beta,
                                  const cudnnTensorDescriptor_t yDesc, void* y) {
  const char* call = "cudnnPoolingForward";
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (!alpha || !beta || !x || !y) return bad(call, "a null scalar or data pointer");
  Pool g;
  if (cudnnStatus_t st = poolCheck(call, poolingDesc, xDesc, yDesc, &g)) return st;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* xp = static_cast<const float*>(x);
  auto* yp = static_cast<float*>(y);
  return run(handle, call, {reads<float>(x, count(*xDesc)), writes<float>(y, count(*yDesc))},
             [=] { poolForwardHost(g, a, xp, b, yp); });
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc,
                                   const void* alpha, const cudnnTensorDescriptor_t yDesc, const void* y,
                                   const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                   const cudnnTensorDescriptor_t xDesc, const void* x, const void* beta,
                                   const cudnnTensorDescriptor_t dxDesc, void* dx) {
  const char* call = "cudnnPoolingBackward";
  if (!handle) return refuse(CUDNN_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (!alpha || !beta || !y || !dy || !x || !dx) return bad(call, "a null scalar or data pointer");
  Pool g;
  if (cudnnStatus_t st = poolCheck(call, poolingDesc, xDesc, yDesc, &g)) return st;
  if (!sameDims(dyDesc, yDesc) || !sameDims(dxDesc, xDesc)) return bad(call, "dy's shape is not y's or dx's not x's");
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const auto* dyp = static_cast<const float*>(dy);
  const auto* xp = static_cast<const float*>(x);
  auto* dxp = static_cast<float*>(dx);
  // y is read as cuDNN reads it (the maxima); the emulation finds them again in x.
  return run(handle, call,
             {reads<float>(y, count(*yDesc)), reads<float>(dy, count(*yDesc)), reads<float>(x, count(*xDesc)),
              writes<float>(dx, count(*xDesc))},
             [=] { poolBackwardHost(g, a, dyp, xp, b, dxp); });
}

}  // extern "C"

// Test hooks (listed in hooks.cpp).
extern "C" {

__attribute__((visibility("default"))) int cxemu_test_last_conv_algo(int pass) {
  return pass >= 0 && pass < 3 ? gLastAlgo[pass].load() : -1;
}

__attribute__((visibility("default"))) int cxemu_test_conv_searches() { return gSearches.load(); }

}  // extern "C"
