// Convolution and pooling on cuDNN's legacy API (cudnn_cnn.h, cudnn_ops.h): float32 NCHW, as api.h
// describes. cuDNN is optional: built without it (CYXWIZ_HAVE_CUDNN undefined) every call fails
// with a message saying how to get it, and cudnnVersion() is 0.
//
// Math: with TF32 off (Api::setTF32, the default) the convolution descriptor asks for
// CUDNN_FMA_MATH, as PyTorch does for float32 without allow_tf32: CUDNN_DEFAULT_MATH would let
// Ampere and later GPUs use TF32 tensor cores, and the results would no longer be comparable with
// the CPU engine's. With TF32 on, CUDNN_DEFAULT_MATH. (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION would
// down-convert float32 to float16, which is not TF32.)
//
// Algorithms, chosen at the first use of a (device, shape, TF32) and cached with the shape's descriptors:
//  - by default, cuDNN's v7 heuristic (cudnnGetConvolution*Algorithm_v7): its first usable answer;
//  - with CYXWIZ_CUDNN_BENCHMARK=1 in the environment (read once, at the first convolution), a search
//    as torch.backends.cudnn.benchmark does: cudnnFindConvolution*Algorithm times every algorithm and
//    the fastest usable one is kept. The non-Ex functions: cuDNN allocates and times with buffers of its
//    own, so our tensors (the dw being accumulated among them) are never written by a trial run. Off by
//    default because it is unmeasured: no GPU run has yet shown that it beats the heuristic on our
//    shapes, and it costs a search (a synchronisation, cudaMalloc'd buffers, every algorithm run) at each
//    first use. The variable is read once per process: an A/B is two runs (e.g. of
//    benchmarks/gpu_cnn_step.py), with CYXWIZ_CUDNN_BENCHMARK=0 and =1.
// "Usable" is the same for both: status SUCCESS, the allowed math type (CUDNN_FMA_MATH unless TF32 is
// on), a workspace within kMaxWorkspaceBytes; and deterministic algorithms before the others, so that
// repeated steps give the same bits (torch's benchmark mode does not prefer them: where the fastest
// algorithm is a non-deterministic one, ours may be slower than torch's).
// A search needs the compute stream outside a capture (its cudaMalloc and synchronisation would
// invalidate the capture): a first use inside a capture takes the heuristic's choice, and so does a
// search that fails or offers nothing usable. Those choices are cached too, and Choice::by records
// which way each was made (the library does not log). A shape first met inside a capture so keeps
// the heuristic's algorithm for the process: its graph holds that kernel anyway, and eager steps of
// the shape then run the same kernel as the graph's replays (the same bits), instead of switching.
// (The engine's graphed step runs eager warm-up steps first, so its shapes are searched there.) Only
// this device's compute stream is checked: a thread capturing another device's stream while it first
// uses a shape on this one would have that capture invalidated by the search (the engine captures one
// device per process).
// The workspace is stream-ordered memory of the call (malloc/free on the compute stream), so a call
// may be captured into a graph.
#include <string>

#include "cyxwiz/cuda/api_impl.h"

#ifdef CYXWIZ_HAVE_CUDNN
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/state.h"
#endif

namespace cyxwiz::cuda {

#ifndef CYXWIZ_HAVE_CUDNN

namespace {

Status withoutCudnn(const char* method, int dev) {
  return std::string(method) + " on cuda:" + std::to_string(dev) +
         ": this libcyxwiz_cuda was built without cuDNN; pip install nvidia-cudnn-cu13 and reinstall pycyxwiz";
}

}  // namespace

int ApiImpl::cudnnVersion() const noexcept { return 0; }

Status ApiImpl::convForward(int dev, const ConvShape&, const float*, const float*, const float*, float*) noexcept {
  return withoutCudnn("convForward", dev);
}
Status ApiImpl::convBackwardData(int dev, const ConvShape&, const float*, const float*, float*) noexcept {
  return withoutCudnn("convBackwardData", dev);
}
Status ApiImpl::convBackwardFilter(int dev, const ConvShape&, const float*, const float*, float*, float*) noexcept {
  return withoutCudnn("convBackwardFilter", dev);
}
Status ApiImpl::poolForward(int dev, const PoolShape&, const float*, float*) noexcept {
  return withoutCudnn("poolForward", dev);
}
Status ApiImpl::poolBackward(int dev, const PoolShape&, const float*, const float*, const float*, float*) noexcept {
  return withoutCudnn("poolBackward", dev);
}

#else  // CYXWIZ_HAVE_CUDNN

namespace {

// The largest workspace an algorithm may ask for: beyond it the heuristic's next choice is taken.
constexpr size_t kMaxWorkspaceBytes = size_t(256) << 20;

// "cudnnConvolutionForward on cuda:0 failed: CUDNN_STATUS_BAD_PARAM (conv x (2, 3, 8, 8) ...): <cuDNN's
// own last message, when it has one>".
Status cudnnFailure(const char* call, int dev, cudnnStatus_t st, const std::string& shape) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  Status m = callOn(call, dev) + " failed: " + cudnnGetErrorString(st) + " (" + shape + ")";
  if (detail[0]) m += ": " + std::string(detail);
  return m;
}

#define CX_CUDNN_TRY(dev, call, shape, expr)                                                  \
  do {                                                                                        \
    cudnnStatus_t cx_dnn_ = (expr);                                                           \
    if (cx_dnn_ != CUDNN_STATUS_SUCCESS) return cudnnFailure(call, dev, cx_dnn_, shape);      \
  } while (0)

std::string dims(std::initializer_list<int64_t> v) {
  std::string s = "(";
  for (int64_t d : v) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + ")";
}

std::string pair(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

std::string convText(const ConvShape& s) {
  const bool divisible = s.groups > 0 && s.c % s.groups == 0;
  const std::string weight = divisible ? dims({s.k, s.c / s.groups, s.kh, s.kw})
                                       : "(" + std::to_string(s.k) + ", " + std::to_string(s.c) + "/" +
                                             std::to_string(s.groups) + ", " + std::to_string(s.kh) + ", " +
                                             std::to_string(s.kw) + ")";
  return "conv x " + dims({s.n, s.c, s.h, s.w}) + ", weight " + weight + ", y " +
         dims({s.n, s.k, s.oh, s.ow}) + ", stride " + pair(s.sh, s.sw) + ", padding " + pair(s.ph, s.pw) +
         ", dilation " + pair(s.dh, s.dw) + ", groups " + std::to_string(s.groups);
}

const char* poolName(PoolKind k) {
  switch (k) {
    case PoolKind::Max: return "max pool";
    case PoolKind::AvgIncludePad: return "avg pool (count_include_pad)";
    case PoolKind::AvgExcludePad: return "avg pool (padding not counted)";
  }
  return "pool of unknown kind";
}

std::string poolText(const PoolShape& s) {
  return std::string(poolName(s.kind)) + " x " + dims({s.n, s.c, s.h, s.w}) + " -> y " + dims({s.n, s.c, s.oh, s.ow}) +
         ", window " + pair(s.kh, s.kw) + ", stride " + pair(s.sh, s.sw) + ", padding " + pair(s.ph, s.pw);
}

bool positive(std::initializer_list<int64_t> v) {
  for (int64_t x : v) {
    if (x <= 0) return false;
  }
  return true;
}

// The legacy descriptors take int sizes and strides, and cuDNN's kernels index tensors of fewer
// than 2^31 elements.
bool fitsInt(std::initializer_list<int64_t> v) {
  for (int64_t x : v) {
    if (x > INT_MAX) return false;
  }
  return true;
}

Status invalid(const char* method, int dev, const std::string& why, const std::string& shape) {
  return std::string(method) + " on cuda:" + std::to_string(dev) + ": " + why + " (" + shape + ")";
}

Status checkConv(const char* method, int dev, const ConvShape& s) {
  if (!positive({s.n, s.c, s.h, s.w, s.k, s.oh, s.ow, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.groups})) {
    return invalid(method, dev, "sizes, strides, dilations and groups must be positive", convText(s));
  }
  if (s.ph < 0 || s.pw < 0) return invalid(method, dev, "padding must not be negative", convText(s));
  if (s.c % s.groups != 0 || s.k % s.groups != 0) {
    return invalid(method, dev,
                   "input channels " + std::to_string(s.c) + " and output channels " + std::to_string(s.k) +
                       " must both be divisible by groups " + std::to_string(s.groups),
                   convText(s));
  }
  if (!fitsInt({s.ph, s.pw, s.sh, s.sw, s.dh, s.dw, s.n * s.c * s.h * s.w, s.n * s.k * s.oh * s.ow,
                s.k * (s.c / s.groups) * s.kh * s.kw})) {
    return invalid(method, dev, "a tensor of 2^31 elements or more, beyond cuDNN's legacy API", convText(s));
  }
  return {};
}

Status checkPool(const char* method, int dev, const PoolShape& s) {
  if (s.kind != PoolKind::Max && s.kind != PoolKind::AvgIncludePad && s.kind != PoolKind::AvgExcludePad) {
    return invalid(method, dev, "unknown PoolKind " + std::to_string(int(s.kind)), poolText(s));
  }
  if (!positive({s.n, s.c, s.h, s.w, s.oh, s.ow, s.kh, s.kw, s.sh, s.sw})) {
    return invalid(method, dev, "sizes, window and stride must be positive", poolText(s));
  }
  // torch's rule ("pad should be at most half of effective kernel size"): no window lies wholly in
  // the padding.
  if (s.ph < 0 || s.pw < 0 || 2 * s.ph > s.kh || 2 * s.pw > s.kw) {
    return invalid(method, dev, "padding must be between 0 and half the window", poolText(s));
  }
  if (!fitsInt({s.n * s.c * s.h * s.w, s.n * s.c * s.oh * s.ow, s.kh, s.kw, s.sh, s.sw})) {
    return invalid(method, dev, "a tensor of 2^31 elements or more, beyond cuDNN's legacy API", poolText(s));
  }
  return {};
}

// The device's cuDNN handle, created on first use (s->mutex held). A handle belongs to the device
// current at cudnnCreate (useDevice made it `dev`).
Status dnnHandle(int dev, DeviceState* s, const std::string& shape, cudnnHandle_t* out) {
  if (!s->dnn) {
    cudnnHandle_t h = nullptr;
    CX_CUDNN_TRY(dev, "cudnnCreate", shape, cudnnCreate(&h));
    const cudnnStatus_t st = cudnnSetStream(h, s->compute);
    if (st != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      return cudnnFailure("cudnnSetStream", dev, st, shape);
    }
    s->dnn = h;
  }
  *out = s->dnn;
  return {};
}

// How a Choice was made: kept with it for a debugger or a future report (the library does not log).
enum class ChosenBy {
  Nothing,               // not chosen yet
  Heuristic,             // the v7 heuristic (CYXWIZ_CUDNN_BENCHMARK off)
  Search,                // cudnnFindConvolution*Algorithm: the fastest usable algorithm
  HeuristicInCapture,    // search on, but the shape's first use was inside a capture of the compute stream
  HeuristicAfterSearch,  // search on, but it failed or offered nothing usable
};

// One algorithm, with the math type it was offered with: set on the convolution descriptor before
// the call, since cuDNN picks the kernel from both.
struct Choice {
  ChosenBy by = ChosenBy::Nothing;
  int algo = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  size_t workspace = 0;
  bool chosen() const { return by != ChosenBy::Nothing; }
};

// A shape's descriptors and its three algorithms (each chosen on the first call that needs it). Only
// used under its device's DeviceState::mutex.
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;  // bias: (1, k, 1, 1)
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Choice forward, backwardData, backwardFilter;
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

struct ConvKey {
  int dev;
  bool tf32;
  ConvShape s;
  bool operator==(const ConvKey& o) const {
    const ConvShape& a = s;
    const ConvShape& b = o.s;
    return dev == o.dev && tf32 == o.tf32 && a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w && a.k == b.k &&
           a.oh == b.oh && a.ow == b.ow && a.kh == b.kh && a.kw == b.kw && a.sh == b.sh && a.sw == b.sw &&
           a.ph == b.ph && a.pw == b.pw && a.dh == b.dh && a.dw == b.dw && a.groups == b.groups;
  }
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    const ConvShape& s = k.s;
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : {int64_t(k.dev), int64_t(k.tf32), s.n, s.c, s.h, s.w, s.k, s.oh, s.ow, s.kh, s.kw, s.sh, s.sw,
                      s.ph, s.pw, s.dh, s.dw, s.groups}) {
      h = (h ^ uint64_t(v)) * 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// Shapes are few in training (each layer's, and those of a last partial batch); the bound only stops
// ever-changing shapes from growing the cache without end. Plans in use survive a clear (shared_ptr).
constexpr size_t kMaxPlans = 1024;
std::mutex gPlansMutex;
std::unordered_map<ConvKey, std::shared_ptr<ConvPlan>, ConvKeyHash> gPlans;

Status describeConv(const char* method, int dev, const ConvShape& s, bool tf32, ConvPlan* p) {
  const std::string text = convText(s);
  const char* create = "cudnnCreateTensorDescriptor";
  CX_CUDNN_TRY(dev, create, text, cudnnCreateTensorDescriptor(&p->x));
  CX_CUDNN_TRY(dev, create, text, cudnnCreateTensorDescriptor(&p->y));
  CX_CUDNN_TRY(dev, create, text, cudnnCreateTensorDescriptor(&p->bias));
  CX_CUDNN_TRY(dev, "cudnnCreateFilterDescriptor", text, cudnnCreateFilterDescriptor(&p->w));
  CX_CUDNN_TRY(dev, "cudnnCreateConvolutionDescriptor", text, cudnnCreateConvolutionDescriptor(&p->conv));
  const char* set = "cudnnSetTensor4dDescriptor";
  CX_CUDNN_TRY(dev, set, text,
               cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n), int(s.c), int(s.h),
                                          int(s.w)));
  CX_CUDNN_TRY(dev, set, text,
               cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n), int(s.k), int(s.oh),
                                          int(s.ow)));
  CX_CUDNN_TRY(dev, set, text, cudnnSetTensor4dDescriptor(p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, int(s.k), 1, 1));
  CX_CUDNN_TRY(dev, "cudnnSetFilter4dDescriptor", text,
               cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(s.k), int(s.c / s.groups),
                                          int(s.kh), int(s.kw)));
  CX_CUDNN_TRY(dev, "cudnnSetConvolution2dDescriptor", text,
               cudnnSetConvolution2dDescriptor(p->conv, int(s.ph), int(s.pw), int(s.sh), int(s.sw), int(s.dh),
                                               int(s.dw), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CX_CUDNN_TRY(dev, "cudnnSetConvolutionGroupCount", text, cudnnSetConvolutionGroupCount(p->conv, int(s.groups)));
  CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", text,
               cudnnSetConvolutionMathType(p->conv, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  int n = 0, k = 0, oh = 0, ow = 0;
  CX_CUDNN_TRY(dev, "cudnnGetConvolution2dForwardOutputDim", text,
               cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &k, &oh, &ow));
  if (n != s.n || k != s.k || oh != s.oh || ow != s.ow) {
    return invalid(method, dev,
                   "the output shape " + dims({s.n, s.k, s.oh, s.ow}) + " is not cuDNN's " + dims({n, k, oh, ow}),
                   text);
  }
  return {};
}

Status convPlan(const char* method, int dev, const ConvShape& s, std::shared_ptr<ConvPlan>* out) {
  const ConvKey key{dev, tf32Enabled(), s};
  {
    std::lock_guard<std::mutex> lock(gPlansMutex);
    auto it = gPlans.find(key);
    if (it != gPlans.end()) {
      *out = it->second;
      return {};
    }
  }
  auto plan = std::make_shared<ConvPlan>();
  CX_TRY(describeConv(method, dev, s, key.tf32, plan.get()));
  std::lock_guard<std::mutex> lock(gPlansMutex);
  if (gPlans.size() >= kMaxPlans) gPlans.clear();
  gPlans[key] = plan;
  *out = plan;
  return {};
}

// Stream-ordered workspace of one call: allocated on the compute stream before the cuDNN call and
// freed after it on the same stream (inside a capture both become graph nodes).
class Workspace {
 public:
  Workspace(Api* api, int dev) : api_(api), dev_(dev) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { api_->free(dev_, ptr_); }
  Status allocate(size_t bytes) {
    bytes_ = bytes;
    return api_->malloc(dev_, bytes, &ptr_);
  }
  void* ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Api* api_;
  int dev_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// What every convolution call starts with: the checks, the device, its lock, its handle, the plan.
struct ConvCall {
  DeviceState* state = nullptr;
  std::unique_lock<std::mutex> lock;
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<ConvPlan> plan;
  std::string text;
};

Status beginConv(const char* method, int dev, const ConvShape& s, ConvCall* c) {
  CX_TRY(checkConv(method, dev, s));
  c->text = convText(s);
  CX_TRY(useDevice(dev, &c->state));
  c->lock = std::unique_lock<std::mutex>(c->state->mutex);
  CX_TRY(dnnHandle(dev, c->state, c->text, &c->handle));
  return convPlan(method, dev, s, &c->plan);
}

// CYXWIZ_CUDNN_BENCHMARK=1: search at first uses (header comment). Read once, at the first convolution.
bool searchEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("CYXWIZ_CUDNN_BENCHMARK");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// Whether the device's compute stream is being captured. A failed query counts as a capture; its
// error is cleared (left as the thread's last error, the next kernel launch would report it).
bool computeCapturing(DeviceState* s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s->compute, &st) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return st != cudaStreamCaptureStatusNone;
}

// Drops cuDNN's message of a failure handled here: it must not be taken for a later failure's.
void dropCudnnMessage() {
  char skipped[256];
  cudnnGetLastErrorString(skipped, sizeof skipped);
}

// What differs between the three passes: cuDNN's functions for each (their own argument orders and
// types) and the plan's Choice. choose<Pass> is the rest.
struct ForwardPass {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr Choice ConvPlan::*kChoice = &ConvPlan::forward;
  static constexpr const char* kMaxCount = "cudnnGetConvolutionForwardAlgorithmMaxCount";
  static constexpr const char* kHeuristic = "cudnnGetConvolutionForwardAlgorithm_v7";
  static constexpr const char* kWorkspace = "cudnnGetConvolutionForwardWorkspaceSize";
  static cudnnStatus_t maxCount(cudnnHandle_t h, int* n) { return cudnnGetConvolutionForwardAlgorithmMaxCount(h, n); }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perfs) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, n, got, perfs);
  }
  static cudnnStatus_t search(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perfs) {
    return cudnnFindConvolutionForwardAlgorithm(h, p.x, p.w, p.conv, p.y, n, got, perfs);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, algo, bytes);
  }
};

struct BackwardDataPass {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr Choice ConvPlan::*kChoice = &ConvPlan::backwardData;
  static constexpr const char* kMaxCount = "cudnnGetConvolutionBackwardDataAlgorithmMaxCount";
  static constexpr const char* kHeuristic = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
  static constexpr const char* kWorkspace = "cudnnGetConvolutionBackwardDataWorkspaceSize";
  static cudnnStatus_t maxCount(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perfs) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, n, got, perfs);
  }
  static cudnnStatus_t search(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perfs) {
    return cudnnFindConvolutionBackwardDataAlgorithm(h, p.w, p.y, p.conv, p.x, n, got, perfs);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, algo, bytes);
  }
};

struct BackwardFilterPass {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr Choice ConvPlan::*kChoice = &ConvPlan::backwardFilter;
  static constexpr const char* kMaxCount = "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount";
  static constexpr const char* kHeuristic = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
  static constexpr const char* kWorkspace = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
  static cudnnStatus_t maxCount(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perfs) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, n, got, perfs);
  }
  static cudnnStatus_t search(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perfs) {
    return cudnnFindConvolutionBackwardFilterAlgorithm(h, p.x, p.y, p.conv, p.w, n, got, perfs);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, Algo algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w, algo, bytes);
  }
};

// The first usable entry of perfs[0, count) into *out, made `by`: status SUCCESS, the allowed math
// type, a workspace (queried with that math type on the descriptor) within kMaxWorkspaceBytes;
// deterministic entries first, each kind in the order given (the heuristic's preference, or the
// search's times, which cuDNN sorts fastest first). *out stays unchosen when none is usable.
template <class Pass>
Status takeFirstUsable(int dev, const ConvCall& c, const std::vector<typename Pass::Perf>& perfs, int count,
                       ChosenBy by, Choice* out) {
  const bool tf32 = tf32Enabled();
  const ConvPlan& p = *c.plan;
  count = std::min(count, int(perfs.size()));
  for (const bool deterministic : {true, false}) {
    for (int i = 0; i < count; ++i) {
      const typename Pass::Perf& e = perfs[size_t(i)];
      if (e.status != CUDNN_STATUS_SUCCESS || (e.determinism == CUDNN_DETERMINISTIC) != deterministic) continue;
      // TF32 off: only FMA kernels (cuDNN may offer others whatever the descriptor says).
      if (!tf32 && e.mathType != CUDNN_FMA_MATH) continue;
      CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", c.text, cudnnSetConvolutionMathType(p.conv, e.mathType));
      size_t bytes = 0;
      if (Pass::workspace(c.handle, p, e.algo, &bytes) != CUDNN_STATUS_SUCCESS) {
        dropCudnnMessage();
        continue;
      }
      if (bytes > kMaxWorkspaceBytes) continue;
      *out = Choice{by, int(e.algo), e.mathType, bytes};
      return {};
    }
  }
  return {};
}

// Chooses the pass's algorithm for the plan's shape (a cache miss): the search's when it is on and
// may run, else the heuristic's (header comment). Fails only when the heuristic offers nothing usable,
// or on a cuDNN error outside the search: a failed search falls back, it never fails the call.
template <class Pass>
Status choose(const char* method, int dev, const ConvCall& c) {
  const ConvPlan& p = *c.plan;
  Choice* out = &(c.plan.get()->*Pass::kChoice);
  // The math type the plan allows: a previous call may have left another (its choice's) on the
  // descriptor, and both cuDNN queries answer for the descriptor's math type.
  const cudnnMathType_t allowed = tf32Enabled() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  int maxCount = 0;
  CX_CUDNN_TRY(dev, Pass::kMaxCount, c.text, Pass::maxCount(c.handle, &maxCount));
  std::vector<typename Pass::Perf> perfs(static_cast<size_t>(maxCount > 0 ? maxCount : 1));
  int count = 0;
  ChosenBy fallback = ChosenBy::Heuristic;
  if (searchEnabled()) {
    fallback = ChosenBy::HeuristicInCapture;
    if (!computeCapturing(c.state)) {
      fallback = ChosenBy::HeuristicAfterSearch;
      CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", c.text, cudnnSetConvolutionMathType(p.conv, allowed));
      if (Pass::search(c.handle, p, int(perfs.size()), &count, perfs.data()) == CUDNN_STATUS_SUCCESS) {
        CX_TRY(takeFirstUsable<Pass>(dev, c, perfs, count, ChosenBy::Search, out));
        if (out->chosen()) return {};
      } else {
        dropCudnnMessage();
        cudaGetLastError();  // a runtime error of cuDNN's own allocations or runs (sticky ones stay)
      }
    }
  }
  CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", c.text, cudnnSetConvolutionMathType(p.conv, allowed));
  count = 0;
  CX_CUDNN_TRY(dev, Pass::kHeuristic, c.text,
               Pass::heuristic(c.handle, p, int(perfs.size()), &count, perfs.data()));
  CX_TRY(takeFirstUsable<Pass>(dev, c, perfs, count, fallback, out));
  if (out->chosen()) return {};
  return invalid(method, dev,
                 std::string("cuDNN's heuristic (") + Pass::kHeuristic + ", then " + Pass::kWorkspace +
                     ") offers no algorithm" + (tf32Enabled() ? "" : " in float32 math (TF32 off)") +
                     " with a workspace of at most 256 MiB",
                 c.text);
}

}  // namespace

int ApiImpl::cudnnVersion() const noexcept { return static_cast<int>(cudnnGetVersion()); }

Status ApiImpl::convForward(int dev, const ConvShape& s, const float* x, const float* w, const float* bias,
                            float* y) noexcept {
  ConvCall c;
  CX_TRY(beginConv("convForward", dev, s, &c));
  ConvPlan& p = *c.plan;
  if (!p.forward.chosen()) CX_TRY(choose<ForwardPass>("convForward", dev, c));
  Workspace ws(this, dev);
  CX_TRY(ws.allocate(p.forward.workspace));
  const float one = 1.0f, zero = 0.0f;
  CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", c.text, cudnnSetConvolutionMathType(p.conv, p.forward.math));
  CX_CUDNN_TRY(dev, "cudnnConvolutionForward", c.text,
               cudnnConvolutionForward(c.handle, &one, p.x, x, p.w, w, p.conv,
                                       static_cast<cudnnConvolutionFwdAlgo_t>(p.forward.algo), ws.ptr(), ws.bytes(),
                                       &zero, p.y, y));
  // y += bias, broadcast over (n, oh, ow).
  if (bias) CX_CUDNN_TRY(dev, "cudnnAddTensor", c.text, cudnnAddTensor(c.handle, &one, p.bias, bias, &one, p.y, y));
  return {};
}

Status ApiImpl::convBackwardData(int dev, const ConvShape& s, const float* dy, const float* w, float* dx) noexcept {
  ConvCall c;
  CX_TRY(beginConv("convBackwardData", dev, s, &c));
  ConvPlan& p = *c.plan;
  if (!p.backwardData.chosen()) CX_TRY(choose<BackwardDataPass>("convBackwardData", dev, c));
  Workspace ws(this, dev);
  CX_TRY(ws.allocate(p.backwardData.workspace));
  const float one = 1.0f, zero = 0.0f;  // dx is overwritten
  CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", c.text, cudnnSetConvolutionMathType(p.conv, p.backwardData.math));
  CX_CUDNN_TRY(dev, "cudnnConvolutionBackwardData", c.text,
               cudnnConvolutionBackwardData(c.handle, &one, p.w, w, p.y, dy, p.conv,
                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(p.backwardData.algo), ws.ptr(),
                                            ws.bytes(), &zero, p.x, dx));
  return {};
}

Status ApiImpl::convBackwardFilter(int dev, const ConvShape& s, const float* x, const float* dy, float* dw,
                                   float* db) noexcept {
  ConvCall c;
  CX_TRY(beginConv("convBackwardFilter", dev, s, &c));
  ConvPlan& p = *c.plan;
  if (!p.backwardFilter.chosen()) CX_TRY(choose<BackwardFilterPass>("convBackwardFilter", dev, c));
  Workspace ws(this, dev);
  CX_TRY(ws.allocate(p.backwardFilter.workspace));
  const float one = 1.0f;  // beta = 1: the gradients accumulate (api.h)
  CX_CUDNN_TRY(dev, "cudnnSetConvolutionMathType", c.text,
               cudnnSetConvolutionMathType(p.conv, p.backwardFilter.math));
  CX_CUDNN_TRY(dev, "cudnnConvolutionBackwardFilter", c.text,
               cudnnConvolutionBackwardFilter(c.handle, &one, p.x, x, p.y, dy, p.conv,
                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.backwardFilter.algo),
                                              ws.ptr(), ws.bytes(), &one, p.w, dw));
  if (db) {
    CX_CUDNN_TRY(dev, "cudnnConvolutionBackwardBias", c.text,
                 cudnnConvolutionBackwardBias(c.handle, &one, p.y, dy, &one, p.bias, db));
  }
  return {};
}

namespace {

// A pooling call's descriptors, created per call (cheap host objects, unlike a convolution's algorithm
// choice) and destroyed on every path.
struct PoolCall {
  DeviceState* state = nullptr;
  std::unique_lock<std::mutex> lock;
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;
  std::string text;
  PoolCall() = default;
  PoolCall(const PoolCall&) = delete;
  PoolCall& operator=(const PoolCall&) = delete;
  ~PoolCall() {
    if (pool) cudnnDestroyPoolingDescriptor(pool);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

Status beginPool(const char* method, int dev, const PoolShape& s, PoolCall* c) {
  CX_TRY(checkPool(method, dev, s));
  c->text = poolText(s);
  CX_TRY(useDevice(dev, &c->state));
  c->lock = std::unique_lock<std::mutex>(c->state->mutex);
  CX_TRY(dnnHandle(dev, c->state, c->text, &c->handle));
  const std::string& text = c->text;
  CX_CUDNN_TRY(dev, "cudnnCreateTensorDescriptor", text, cudnnCreateTensorDescriptor(&c->x));
  CX_CUDNN_TRY(dev, "cudnnCreateTensorDescriptor", text, cudnnCreateTensorDescriptor(&c->y));
  CX_CUDNN_TRY(dev, "cudnnCreatePoolingDescriptor", text, cudnnCreatePoolingDescriptor(&c->pool));
  CX_CUDNN_TRY(dev, "cudnnSetTensor4dDescriptor", text,
               cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n), int(s.c), int(s.h),
                                          int(s.w)));
  CX_CUDNN_TRY(dev, "cudnnSetTensor4dDescriptor", text,
               cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.n), int(s.c), int(s.oh),
                                          int(s.ow)));
  // Max: the deterministic variant (the same gradient routing every step). NaN propagates, as in
  // torch's max pooling. Average: torch's count_include_pad=True / False.
  const cudnnPoolingMode_t mode = s.kind == PoolKind::Max             ? CUDNN_POOLING_MAX_DETERMINISTIC
                                  : s.kind == PoolKind::AvgIncludePad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                      : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  CX_CUDNN_TRY(dev, "cudnnSetPooling2dDescriptor", text,
               cudnnSetPooling2dDescriptor(c->pool, mode, CUDNN_PROPAGATE_NAN, int(s.kh), int(s.kw), int(s.ph),
                                           int(s.pw), int(s.sh), int(s.sw)));
  // PoolShape gives oh and ow (torch's ceil_mode=False sizes); cuDNN computes its own.
  int n = 0, ch = 0, oh = 0, ow = 0;
  CX_CUDNN_TRY(dev, "cudnnGetPooling2dForwardOutputDim", text,
               cudnnGetPooling2dForwardOutputDim(c->pool, c->x, &n, &ch, &oh, &ow));
  if (n != s.n || ch != s.c || oh != s.oh || ow != s.ow) {
    return invalid(method, dev,
                   "the output shape " + dims({s.n, s.c, s.oh, s.ow}) + " is not cuDNN's " + dims({n, ch, oh, ow}),
                   text);
  }
  return {};
}

}  // namespace

Status ApiImpl::poolForward(int dev, const PoolShape& s, const float* x, float* y) noexcept {
  PoolCall c;
  CX_TRY(beginPool("poolForward", dev, s, &c));
  const float one = 1.0f, zero = 0.0f;
  CX_CUDNN_TRY(dev, "cudnnPoolingForward", c.text, cudnnPoolingForward(c.handle, c.pool, &one, c.x, x, &zero, c.y, y));
  return {};
}

Status ApiImpl::poolBackward(int dev, const PoolShape& s, const float* x, const float* y, const float* dy,
                             float* dx) noexcept {
  PoolCall c;
  CX_TRY(beginPool("poolBackward", dev, s, &c));
  const float one = 1.0f, zero = 0.0f;  // dx is overwritten
  CX_CUDNN_TRY(dev, "cudnnPoolingBackward", c.text,
               cudnnPoolingBackward(c.handle, c.pool, &one, c.y, y, c.y, dy, c.x, x, &zero, c.x, dx));
  return {};
}

#endif  // CYXWIZ_HAVE_CUDNN

}  // namespace cyxwiz::cuda
