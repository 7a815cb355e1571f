#include "cyxwiz/tensor/dnnl.h"

#include <algorithm>
#include <list>
#include <memory>
#include <mutex>
#include <new>

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/dynlib.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/dnnl_api.h"

namespace cyxwiz::dnnl {

using namespace dnnl_api;

namespace {

const char* kNotLoaded = "not loaded (pip install onednn-cpu-gomp; CYXWIZ_ONEDNN=0 turns it off)";

struct State {
  std::mutex mutex;
  std::string path;
  bool tried = false;
  bool enabled = true;
  bool loaded = false;
  Functions f{};
  Handle engine = nullptr;
  std::string info = kNotLoaded;
  int bf16Conv = -1;  // probed at the first ask: 1 when this CPU has bfloat16 convolutions, 0 when not
};

State& state() {
  static State s;
  return s;
}

template <typename T>
bool bind(void* lib, const char* name, T& out, std::string& missing) {
  out = reinterpret_cast<T>(platform::findSymbol(lib, name));
  if (!out && missing.empty()) missing = name;
  return out != nullptr;
}

void open(State& s) {
  s.tried = true;
  if (s.path.empty()) return;
  std::string error;
  void* lib = platform::openLibrary(s.path, &error);
  if (!lib) {
    s.info = "could not open " + s.path + ": " + error;
    return;
  }
  Functions& f = s.f;
  std::string missing;
  bind(lib, "dnnl_engine_create", f.engineCreate, missing);
  bind(lib, "dnnl_stream_create", f.streamCreate, missing);
  bind(lib, "dnnl_stream_wait", f.streamWait, missing);
  bind(lib, "dnnl_memory_desc_create_with_tag", f.memoryDescCreateWithTag, missing);
  bind(lib, "dnnl_memory_desc_destroy", f.memoryDescDestroy, missing);
  bind(lib, "dnnl_memory_desc_equal", f.memoryDescEqual, missing);
  bind(lib, "dnnl_memory_desc_get_size", f.memoryDescGetSize, missing);
  bind(lib, "dnnl_memory_create", f.memoryCreate, missing);
  bind(lib, "dnnl_memory_destroy", f.memoryDestroy, missing);
  bind(lib, "dnnl_convolution_forward_primitive_desc_create", f.convForwardPdCreate, missing);
  bind(lib, "dnnl_convolution_backward_data_primitive_desc_create", f.convBackwardDataPdCreate, missing);
  bind(lib, "dnnl_convolution_backward_weights_primitive_desc_create", f.convBackwardWeightsPdCreate, missing);
  bind(lib, "dnnl_reorder_primitive_desc_create", f.reorderPdCreate, missing);
  bind(lib, "dnnl_primitive_desc_query_md", f.pdQueryMd, missing);
  bind(lib, "dnnl_primitive_desc_query", f.pdQuery, missing);
  bind(lib, "dnnl_primitive_desc_destroy", f.pdDestroy, missing);
  bind(lib, "dnnl_primitive_create", f.primitiveCreate, missing);
  bind(lib, "dnnl_primitive_destroy", f.primitiveDestroy, missing);
  bind(lib, "dnnl_primitive_execute", f.primitiveExecute, missing);
  bind(lib, "dnnl_version", f.version, missing);
  bind(lib, "dnnl_memory_desc_create_with_strides", f.memoryDescCreateWithStrides, missing);
  bind(lib, "dnnl_matmul_primitive_desc_create", f.matmulPdCreate, missing);
  bind(lib, "dnnl_primitive_attr_create", f.attrCreate, missing);
  bind(lib, "dnnl_primitive_attr_destroy", f.attrDestroy, missing);
  bind(lib, "dnnl_post_ops_create", f.postOpsCreate, missing);
  bind(lib, "dnnl_post_ops_destroy", f.postOpsDestroy, missing);
  bind(lib, "dnnl_post_ops_append_sum", f.postOpsAppendSum, missing);
  bind(lib, "dnnl_primitive_attr_set_post_ops", f.attrSetPostOps, missing);
  // The OpenMP runtime this build of oneDNN runs on (a dependency of the library, found through it).
  bind(lib, "omp_set_num_threads", f.ompSetNumThreads, missing);
  if (!missing.empty()) {
    s.info = s.path + " lacks " + missing + " (oneDNN 3.x built with OpenMP, the onednn-cpu-gomp wheel, has it)";
    return;
  }
  if (f.engineCreate(&s.engine, kEngineCpu, 0) != kSuccess) {
    s.info = s.path + ": no CPU engine";
    return;
  }
  const int* v = static_cast<const int*>(f.version());
  s.info = makeString("oneDNN ", v[0], ".", v[1], ".", v[2]);  // info() says what it runs
  s.loaded = true;
}

const Functions& fn() { return state().f; }

// RAII for oneDNN handles.
struct MemoryDesc {
  Handle h = nullptr;
  MemoryDesc() = default;
  MemoryDesc(const MemoryDesc&) = delete;
  MemoryDesc& operator=(const MemoryDesc&) = delete;
  ~MemoryDesc() {
    if (h) fn().memoryDescDestroy(h);
  }
};
struct PrimitiveDesc {
  Handle h = nullptr;
  PrimitiveDesc() = default;
  PrimitiveDesc(const PrimitiveDesc&) = delete;
  PrimitiveDesc& operator=(const PrimitiveDesc&) = delete;
  ~PrimitiveDesc() {
    if (h) fn().pdDestroy(h);
  }
};
struct Primitive {
  Handle h = nullptr;
  Primitive() = default;
  Primitive(const Primitive&) = delete;
  Primitive& operator=(const Primitive&) = delete;
  ~Primitive() {
    if (h) fn().primitiveDestroy(h);
  }
};
struct Memory {
  Handle h = nullptr;
  Memory(ConstHandle md, void* data) {
    CYX_CHECK(fn().memoryCreate(&h, md, state().engine, data) == kSuccess, "oneDNN: could not wrap a buffer");
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() {
    if (h) fn().memoryDestroy(h);
  }
};

// A buffer in a layout of oneDNN's choosing (64-byte aligned, as its kernels prefer).
struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes) : p(::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64))) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { ::operator delete(p, std::align_val_t(64)); }
};

Handle stream() {
  thread_local Handle s = nullptr;  // a stream is not for concurrent use: one per thread, never freed
  if (!s) CYX_CHECK(fn().streamCreate(&s, state().engine, kStreamInOrder) == kSuccess, "oneDNN: no stream");
  return s;
}

void execute(ConstHandle primitive, std::initializer_list<ExecArg> args) {
  CYX_CHECK(fn().primitiveExecute(primitive, stream(), static_cast<int>(args.size()), args.begin()) == kSuccess,
            "oneDNN: a primitive failed to execute");
  fn().streamWait(stream());
}

// A reorder from one layout to another, or none when they are the same.
struct Reorder {
  Primitive primitive;
  ConstHandle to = nullptr;  // the destination's memory descriptor (owned by a primitive descriptor)
  bool needed() const { return primitive.h != nullptr; }
};

void makeReorder(Reorder& r, ConstHandle from, ConstHandle to) {
  r.to = to;
  if (fn().memoryDescEqual(from, to)) return;
  PrimitiveDesc pd;
  CYX_CHECK(fn().reorderPdCreate(&pd.h, from, state().engine, to, state().engine, nullptr) == kSuccess,
            "oneDNN: no reorder between two layouts");
  CYX_CHECK(fn().primitiveCreate(&r.primitive.h, pd.h) == kSuccess, "oneDNN: could not create a reorder");
}

// Everything one convolution shape needs, created once: the three primitives, their layouts and the
// reorders between those and the plain arrays.
struct Entry {
  ConvShape shape;
  int threads = 1;
  bool ok = false;
  MemoryDesc x, w, b, y, dx;  // plain: NCHW (x in the operands' type), (G,) O, I, H, W, X; dx float32
  PrimitiveDesc fwdPd, dataPd, weightsPd;
  Primitive fwd, data, weights;
  Reorder xToFwd, wToFwd, fwdToY;        // forward
  Reorder xToWeights, dyToWeights, weightsToDw;  // backward, weights
  Reorder dyToData, wToData, dataToDx;   // backward, data
};

void build(Entry& e) {
  const Functions& f = fn();
  const ConvShape& s = e.shape;
  const int64_t g = s.groups;
  int64_t xd[4] = {s.batch, s.channels, s.height, s.width}, yd[4] = {s.batch, s.outChannels, s.outHeight, s.outWidth};
  int64_t wd[5] = {g, s.outChannels / g, s.channels / g, s.kh, s.kw}, bd[1] = {s.outChannels};
  const bool grouped = g > 1;
  const int64_t* wdims = grouped ? wd : wd + 1;
  auto make = [&](MemoryDesc& md, int n, const int64_t* dims, int dtype, int tag) {
    CYX_CHECK(f.memoryDescCreateWithTag(&md.h, n, dims, dtype, tag) == kSuccess, "oneDNN: bad memory descriptor");
  };
  // Plain: the input as the caller holds it (float32, or bfloat16 bits), everything else float32.
  const int op = s.bf16 ? kBF16 : kF32;  // the operands' type inside the kernels
  make(e.x, 4, xd, op, kTagABCD);
  make(e.y, 4, yd, kF32, kTagABCD);
  make(e.w, grouped ? 5 : 4, wdims, kF32, grouped ? kTagABCDE : kTagABCD);
  make(e.b, 1, bd, kF32, kTagA);
  make(e.dx, 4, xd, kF32, kTagABCD);
  // "any": the kernel picks its layout. Operands (input, weight, output gradient) in `op`, results in float32.
  MemoryDesc xOp, wOp, yOp, xOut, wOut, yOut;
  make(xOp, 4, xd, op, kTagAny);
  make(wOp, grouped ? 5 : 4, wdims, op, kTagAny);
  make(yOp, 4, yd, op, kTagAny);
  make(xOut, 4, xd, kF32, kTagAny);
  make(wOut, grouped ? 5 : 4, wdims, kF32, kTagAny);
  make(yOut, 4, yd, kF32, kTagAny);
  Dims strides = {s.sh, s.sw}, dilates = {s.dh - 1, s.dw - 1}, pad = {s.ph, s.pw};
  if (f.convForwardPdCreate(&e.fwdPd.h, state().engine, kForwardTraining, kConvolutionDirect, xOp.h, wOp.h,
                            s.bias ? e.b.h : nullptr, yOut.h, strides, dilates, pad, pad, nullptr) != kSuccess ||
      f.convBackwardDataPdCreate(&e.dataPd.h, state().engine, kConvolutionDirect, xOut.h, wOp.h, yOp.h, strides,
                                 dilates, pad, pad, e.fwdPd.h, nullptr) != kSuccess ||
      f.convBackwardWeightsPdCreate(&e.weightsPd.h, state().engine, kConvolutionDirect, xOp.h, wOut.h,
                                    s.bias ? e.b.h : nullptr, yOp.h, strides, dilates, pad, pad, e.fwdPd.h,
                                    nullptr) != kSuccess) {
    return;  // no kernel for this shape: the caller computes it
  }
  CYX_CHECK(f.primitiveCreate(&e.fwd.h, e.fwdPd.h) == kSuccess && f.primitiveCreate(&e.data.h, e.dataPd.h) == kSuccess &&
                f.primitiveCreate(&e.weights.h, e.weightsPd.h) == kSuccess,
            "oneDNN: could not create the convolution primitives");
  makeReorder(e.xToFwd, e.x.h, f.pdQueryMd(e.fwdPd.h, kQuerySrcMd, 0));
  makeReorder(e.wToFwd, e.w.h, f.pdQueryMd(e.fwdPd.h, kQueryWeightsMd, 0));
  makeReorder(e.fwdToY, f.pdQueryMd(e.fwdPd.h, kQueryDstMd, 0), e.y.h);
  makeReorder(e.xToWeights, e.x.h, f.pdQueryMd(e.weightsPd.h, kQuerySrcMd, 0));
  makeReorder(e.dyToWeights, e.y.h, f.pdQueryMd(e.weightsPd.h, kQueryDiffDstMd, 0));
  makeReorder(e.weightsToDw, f.pdQueryMd(e.weightsPd.h, kQueryDiffWeightsMd, 0), e.w.h);
  makeReorder(e.dyToData, e.y.h, f.pdQueryMd(e.dataPd.h, kQueryDiffDstMd, 0));
  makeReorder(e.wToData, e.w.h, f.pdQueryMd(e.dataPd.h, kQueryWeightsMd, 0));
  makeReorder(e.dataToDx, f.pdQueryMd(e.dataPd.h, kQueryDiffSrcMd, 0), e.dx.h);
  e.ok = true;
}

// The entry for a shape at the current thread count; a few dozen shapes stay cached (a model has few,
// and a smaller last batch adds one each).
std::shared_ptr<Entry> entryFor(const ConvShape& shape) {
  static std::mutex mutex;
  static std::list<std::shared_ptr<Entry>> cache;
  const int threads = blas::numThreads();
  fn().ompSetNumThreads(threads);  // for this call's execution, on this thread
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    if ((*it)->shape == shape && (*it)->threads == threads) {
      cache.splice(cache.begin(), cache, it);
      return cache.front();
    }
  }
  auto e = std::make_shared<Entry>();
  e->shape = shape;
  e->threads = threads;
  build(*e);
  cache.push_front(e);
  if (cache.size() > 64) cache.pop_back();
  return e;
}

// `data` in the layout `r.to` wants: reordered into `scratch`, or as it is.
void* inLayout(const Reorder& r, ConstHandle plainMd, const void* data, std::unique_ptr<Scratch>& scratch) {
  if (!r.needed()) return const_cast<void*>(data);
  scratch = std::make_unique<Scratch>(fn().memoryDescGetSize(r.to));
  Memory from(plainMd, const_cast<void*>(data)), to(r.to, scratch->p);
  execute(r.primitive.h, {{kArgSrc, from.h}, {kArgDst, to.h}});
  return scratch->p;
}

}  // namespace

bool ConvShape::operator==(const ConvShape& o) const {
  return batch == o.batch && channels == o.channels && height == o.height && width == o.width &&
         outChannels == o.outChannels && outHeight == o.outHeight && outWidth == o.outWidth && kh == o.kh &&
         kw == o.kw && sh == o.sh && sw == o.sw && ph == o.ph && pw == o.pw && dh == o.dh && dw == o.dw &&
         groups == o.groups && bias == o.bias && bf16 == o.bf16;
}

void setLibrary(const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.loaded) return;  // a library is open for good (never closed): keep it
  s.path = path;
  s.tried = false;
  s.info = path.empty() ? kNotLoaded : "not loaded yet";
}

bool available() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  return s.enabled && s.loaded;
}

void setEnabled(bool enabled) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.enabled = enabled;
}

namespace {

// oneDNN has bfloat16 convolutions from avx512_core up (natively with AVX512-BF16 or AMX); on other CPUs
// (or below ONEDNN_MAX_CPU_ISA) it declines them and autocast's convolutions round their operands for
// the float32 kernel. A 3x3 shape answers for the CPU. Under s.mutex, with the library loaded.
bool probeBf16Conv(State& s) {
  if (s.bf16Conv < 0) {
    Entry e;
    e.shape = ConvShape{1, 16, 8, 8, 16, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, true};
    build(e);
    s.bf16Conv = e.ok ? 1 : 0;
  }
  return s.bf16Conv == 1;
}

}  // namespace

std::string info() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  if (!s.loaded) return s.info;
  const char* bf16 = probeBf16Conv(s) ? ", bfloat16 convolution"
                                      : "; no bfloat16 convolution for this CPU's ISA (oneDNN has them from "
                                        "avx512_core up): autocast rounds a convolution's operands for the float32 "
                                        "kernel";
  return makeString(s.info, " (convolution, bfloat16 matmul", bf16, ") from ", s.path, s.enabled ? "" : "; disabled");
}

bool loaded() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.tried) open(s);
  return s.loaded;
}

namespace {

struct MatmulKey {
  bool transA, transB;
  int64_t M, N, K, lda, ldb, ldc;
  bool accumulate;
  int threads;
  bool operator==(const MatmulKey& o) const {
    return transA == o.transA && transB == o.transB && M == o.M && N == o.N && K == o.K && lda == o.lda &&
           ldb == o.ldb && ldc == o.ldc && accumulate == o.accumulate && threads == o.threads;
  }
};

struct Matmul {
  MatmulKey key;
  bool ok = false;
  MemoryDesc a, b, c;
  PrimitiveDesc pd;
  Primitive primitive;
};

void build(Matmul& m) {
  const Functions& f = fn();
  const MatmulKey& k = m.key;
  // Logical A (M, K), B (K, N), C (M, N) over the row-major arrays, a transposed operand by its strides.
  int64_t ad[2] = {k.M, k.K}, bd[2] = {k.K, k.N}, cd[2] = {k.M, k.N};
  int64_t as[2] = {k.transA ? 1 : k.lda, k.transA ? k.lda : 1}, bs[2] = {k.transB ? 1 : k.ldb, k.transB ? k.ldb : 1},
          cs[2] = {k.ldc, 1};
  if (f.memoryDescCreateWithStrides(&m.a.h, 2, ad, kBF16, as) != kSuccess ||
      f.memoryDescCreateWithStrides(&m.b.h, 2, bd, kBF16, bs) != kSuccess ||
      f.memoryDescCreateWithStrides(&m.c.h, 2, cd, kF32, cs) != kSuccess) {
    return;
  }
  Handle attr = nullptr, postOps = nullptr;
  if (k.accumulate) {  // C += A B: a sum post-op
    if (f.attrCreate(&attr) != kSuccess) return;
    if (f.postOpsCreate(&postOps) != kSuccess || f.postOpsAppendSum(postOps, 1.0f, 0, kUndef) != kSuccess ||
        f.attrSetPostOps(attr, postOps) != kSuccess) {
      if (postOps) f.postOpsDestroy(postOps);
      f.attrDestroy(attr);
      return;
    }
  }
  const bool made = f.matmulPdCreate(&m.pd.h, state().engine, m.a.h, m.b.h, nullptr, m.c.h, attr) == kSuccess &&
                    f.primitiveCreate(&m.primitive.h, m.pd.h) == kSuccess;
  if (postOps) f.postOpsDestroy(postOps);
  if (attr) f.attrDestroy(attr);
  m.ok = made;
}

}  // namespace

bool gemmBf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  CYX_CHECK(beta == 0.0f || beta == 1.0f, "dnnl::gemmBf16: beta must be 0 or 1");
  if (M == 0 || N == 0) return true;
  static std::mutex mutex;
  static std::list<std::shared_ptr<Matmul>> cache;
  const int threads = blas::numThreads();
  fn().ompSetNumThreads(threads);
  const MatmulKey key{transA, transB, M, N, K, lda, ldb, ldc, beta == 1.0f, threads};
  std::shared_ptr<Matmul> m;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = cache.begin(); it != cache.end() && !m; ++it) {
      if ((*it)->key == key) {
        cache.splice(cache.begin(), cache, it);
        m = cache.front();
      }
    }
    if (!m) {
      m = std::make_shared<Matmul>();
      m->key = key;
      build(*m);
      cache.push_front(m);
      if (cache.size() > 64) cache.pop_back();
    }
  }
  if (!m->ok) return false;
  Memory a(m->a.h, const_cast<uint16_t*>(A)), b(m->b.h, const_cast<uint16_t*>(B)), c(m->c.h, C);
  execute(m->primitive.h, {{kArgSrc, a.h}, {kArgWeights, b.h}, {kArgDst, c.h}});
  return true;
}

bool convForward(const ConvShape& shape, const void* x, const float* w, const float* b, float* y) {
  const std::shared_ptr<Entry> e = entryFor(shape);
  if (!e->ok) return false;
  std::unique_ptr<Scratch> xs, ws, ys;
  void* xf = inLayout(e->xToFwd, e->x.h, x, xs);
  void* wf = inLayout(e->wToFwd, e->w.h, w, ws);
  const ConstHandle yMd = fn().pdQueryMd(e->fwdPd.h, kQueryDstMd, 0);
  if (e->fwdToY.needed()) ys = std::make_unique<Scratch>(fn().memoryDescGetSize(yMd));
  Memory src(fn().pdQueryMd(e->fwdPd.h, kQuerySrcMd, 0), xf), weights(fn().pdQueryMd(e->fwdPd.h, kQueryWeightsMd, 0), wf),
      dst(yMd, ys ? ys->p : y);
  if (b) {
    Memory bias(e->b.h, const_cast<float*>(b));
    execute(e->fwd.h, {{kArgSrc, src.h}, {kArgWeights, weights.h}, {kArgBias, bias.h}, {kArgDst, dst.h}});
  } else {
    execute(e->fwd.h, {{kArgSrc, src.h}, {kArgWeights, weights.h}, {kArgDst, dst.h}});
  }
  if (ys) {
    Memory plain(e->y.h, y);
    execute(e->fwdToY.primitive.h, {{kArgSrc, dst.h}, {kArgDst, plain.h}});
  }
  return true;
}

bool convBackwardWeights(const ConvShape& shape, const void* x, const float* dy, float* dw, float* db) {
  const std::shared_ptr<Entry> e = entryFor(shape);
  if (!e->ok) return false;
  std::unique_ptr<Scratch> xs, dys;
  void* xf = inLayout(e->xToWeights, e->x.h, x, xs);
  void* dyf = inLayout(e->dyToWeights, e->y.h, dy, dys);
  // oneDNN overwrites its outputs; the module's gradients accumulate: computed aside, then added.
  const ConstHandle dwMd = fn().pdQueryMd(e->weightsPd.h, kQueryDiffWeightsMd, 0);
  Scratch dwOut(fn().memoryDescGetSize(dwMd));
  const size_t wCount = fn().memoryDescGetSize(e->w.h) / sizeof(float);
  Scratch dwPlain(wCount * sizeof(float)), dbOut(static_cast<size_t>(shape.outChannels) * sizeof(float));
  Memory src(fn().pdQueryMd(e->weightsPd.h, kQuerySrcMd, 0), xf), diffDst(fn().pdQueryMd(e->weightsPd.h, kQueryDiffDstMd, 0), dyf),
      diffWeights(dwMd, dwOut.p);
  if (db) {
    Memory diffBias(e->b.h, dbOut.p);
    execute(e->weights.h, {{kArgSrc, src.h}, {kArgDiffDst, diffDst.h}, {kArgDiffWeights, diffWeights.h}, {kArgDiffBias, diffBias.h}});
    const float* add = static_cast<const float*>(dbOut.p);
    for (int64_t c = 0; c < shape.outChannels; ++c) db[c] += add[c];
  } else {
    execute(e->weights.h, {{kArgSrc, src.h}, {kArgDiffDst, diffDst.h}, {kArgDiffWeights, diffWeights.h}});
  }
  const float* add = static_cast<const float*>(dwOut.p);
  if (e->weightsToDw.needed()) {
    Memory plain(e->w.h, dwPlain.p);
    execute(e->weightsToDw.primitive.h, {{kArgSrc, diffWeights.h}, {kArgDst, plain.h}});
    add = static_cast<const float*>(dwPlain.p);
  }
  for (size_t i = 0; i < wCount; ++i) dw[i] += add[i];
  return true;
}

bool convBackwardData(const ConvShape& shape, const float* dy, const float* w, float* dx) {
  const std::shared_ptr<Entry> e = entryFor(shape);
  if (!e->ok) return false;
  std::unique_ptr<Scratch> dys, ws, dxs;
  void* dyf = inLayout(e->dyToData, e->y.h, dy, dys);
  void* wf = inLayout(e->wToData, e->w.h, w, ws);
  const ConstHandle dxMd = fn().pdQueryMd(e->dataPd.h, kQueryDiffSrcMd, 0);
  if (e->dataToDx.needed()) dxs = std::make_unique<Scratch>(fn().memoryDescGetSize(dxMd));
  Memory diffDst(fn().pdQueryMd(e->dataPd.h, kQueryDiffDstMd, 0), dyf), weights(fn().pdQueryMd(e->dataPd.h, kQueryWeightsMd, 0), wf),
      diffSrc(dxMd, dxs ? dxs->p : dx);
  execute(e->data.h, {{kArgDiffDst, diffDst.h}, {kArgWeights, weights.h}, {kArgDiffSrc, diffSrc.h}});
  if (dxs) {
    Memory plain(e->dx.h, dx);
    execute(e->dataToDx.primitive.h, {{kArgSrc, diffSrc.h}, {kArgDst, plain.h}});
  }
  return true;
}

}  // namespace cyxwiz::dnnl
