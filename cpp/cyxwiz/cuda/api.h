// The boundary between the engine (_core, never linked against CUDA) and libcyxwiz_cuda.so, the
// CUDA library that _core opens on first use (cyxwiz/cuda/loader.h).
//
// Why an interface of raw pointers and status strings: the two libraries are separate shared objects
// with hidden symbols, so nothing may cross it that needs shared type identity (exceptions, RTTI,
// engine classes). Every method is noexcept and returns an empty Status on success or a message
// naming the failing CUDA/cuBLAS/NCCL call and its error string; _core turns that into an exception.
//
// Streams: the library keeps one compute stream and one communication stream per device. Every
// method that takes `dev` runs on that device's compute stream, in call order. Memory is
// stream-ordered (cudaMallocAsync pool), so freeing a buffer whose kernels are still queued is safe.
// Matrices are row-major, as in blas::sgemm.
#pragma once

#include <cstddef>
#include <climits>
#include <cstdint>
#include <string>

namespace cyxwiz::cuda {

// Bumped on any change below; _core refuses a library of another version.
constexpr int kApiVersion = 12;
// A class index no label equals: cross-entropy and countCorrect without an ignore_index.
constexpr int64_t kNoIgnoreIndex = INT64_MIN;

using Status = std::string;  // empty: success

enum class CopyKind : int { HostToDevice = 0, DeviceToHost = 1, DeviceToDevice = 2 };
// LeakyReLU takes its negative slope and ELU its alpha as the `param` of the activation calls; the
// others ignore it. Swish is SiLU (x sigmoid(x)); Mish is x tanh(softplus(x)), softplus(x) = x above 20.
enum class Activation : int { ReLU = 0, GELU = 1, Sigmoid = 2, Tanh = 3, LeakyReLU = 4, ELU = 5, Swish = 6, Mish = 7 };
// Same codes as cyxwiz::DType (its first six) and cyxwiz::comm::ReduceOp.
enum class ElemType : int { Float32 = 0, Float64 = 1, Int32 = 2, Int64 = 3, Float16 = 4, BFloat16 = 5 };
enum class ReduceKind : int { Sum = 0, Avg = 1, Max = 2, Min = 3, Product = 4 };
enum class CollectiveKind : int { AllReduce = 0, Broadcast = 1, AllGather = 2, ReduceScatter = 3 };

// One parameter of a fused optimizer step: its values, gradient and state buffers, n elements each.
// SGD: m is the momentum buffer (null without momentum), v unused. Adam: m and v are the moments.
struct OptimizerTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
};

// A 2-D convolution (cross-correlation, as torch's) over NCHW float32 tensors, all contiguous:
// x (n, c, h, w), weight (k, c / groups, kh, kw), y (n, k, oh, ow), bias (k).
struct ConvShape {
  int64_t n, c, h, w;
  int64_t k, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t groups;
};

enum class PoolKind : int {
  Max = 0,
  AvgIncludePad = 1,  // torch's count_include_pad=True: every window divides by kh * kw
  AvgExcludePad = 2,  // divides by the window's positions inside the input
};

// Pooling over NCHW float32: x (n, c, h, w) -> y (n, c, oh, ow). Padding of a max window is -inf.
struct PoolShape {
  int64_t n, c, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  PoolKind kind;
};

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  size_t totalMemory = 0;
  int multiProcessors = 0;
  // Which physical GPU this is, whatever index or CUDA_VISIBLE_DEVICES spelling names it:
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as nvidia-smi -L) and "0000:3b:00.0".
  std::string uuid;
  std::string pciBusId;
};

class Api {
 public:
  virtual ~Api() = default;
  virtual int apiVersion() const noexcept = 0;

  // What this library was built with: CUDA runtime (e.g. 13000), NCCL (e.g. 23203), cuBLAS
  // (e.g. 130100) and the compiled architectures ("90;100").
  virtual int cudaRuntimeVersion() const noexcept = 0;
  virtual int ncclVersion() const noexcept = 0;
  virtual int cublasVersion() const noexcept = 0;
  virtual const char* architectures() const noexcept = 0;
  // cuDNN's version (e.g. 91400) when this library was built with it, else 0: the convolution and
  // pooling calls then fail with a message that says how to get it.
  virtual int cudnnVersion() const noexcept = 0;

  // ---- devices ----
  // Fails (with the runtime's text) when there is no driver or no device; 0 devices is not a failure.
  virtual Status deviceCount(int* count) noexcept = 0;
  virtual Status driverVersion(int* version) noexcept = 0;
  virtual Status deviceProperties(int dev, DeviceProperties* out) noexcept = 0;
  // The device owning `ptr`, or -1 for host memory (for __cuda_array_interface__ producers).
  virtual Status pointerDevice(const void* ptr, int* dev) noexcept = 0;

  // ---- memory ----
  virtual Status malloc(int dev, size_t bytes, void** out) noexcept = 0;
  virtual void free(int dev, void* ptr) noexcept = 0;  // stream-ordered; errors ignored (process exit)
  virtual Status mallocHost(size_t bytes, void** out) noexcept = 0;  // pinned
  virtual void freeHost(void* ptr) noexcept = 0;
  // On dev's compute stream. DeviceToHost returns once the bytes are on the host; HostToDevice returns
  // once `src` may be reused.
  virtual Status copy(int dev, void* dst, const void* src, size_t bytes, CopyKind kind) noexcept = 0;
  virtual Status memsetZero(int dev, void* dst, size_t bytes) noexcept = 0;
  virtual Status fill(int dev, float* dst, int64_t n, float value) noexcept = 0;
  // Waits for the compute stream; `*done` without waiting.
  virtual Status synchronize(int dev) noexcept = 0;
  virtual Status query(int dev, bool* done) noexcept = 0;

  // ---- math, float32, on the compute stream ----
  // TF32 tensor-core GEMMs (off by default: results comparable with the CPU engine).
  virtual void setTF32(bool enabled) noexcept = 0;
  // C = alpha * op(A) op(B) + beta * C, row-major, as blas::sgemm.
  virtual Status gemm(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) noexcept = 0;
  // out[r, :] = row for every r (seeds a linear layer's output with its bias).
  virtual Status broadcastRows(int dev, const float* row, float* out, int64_t rows, int64_t cols) noexcept = 0;
  // out[j] += sum_r g[r, j] (bias gradient).
  virtual Status addColumnSums(int dev, const float* g, float* out, int64_t rows, int64_t cols) noexcept = 0;
  // y = f(x); dx = g * f'(x), f' evaluated at the layer input x. Formulas as the CPU modules; `param`
  // is LeakyReLU's slope or ELU's alpha (see Activation).
  virtual Status activationForward(int dev, Activation f, const float* x, float* y, int64_t n,
                                   float param) noexcept = 0;
  virtual Status activationBackward(int dev, Activation f, const float* x, const float* g, float* dx, int64_t n,
                                    float param) noexcept = 0;
  // out = a * b element-wise.
  virtual Status multiply(int dev, const float* a, const float* b, float* out, int64_t n) noexcept = 0;
  // out = a + b element-wise (out may be a or b): a residual block's sum and its gradients' sum.
  virtual Status add(int dev, const float* a, const float* b, float* out, int64_t n) noexcept = 0;

  // ---- convolution and pooling: cuDNN (cudnnVersion() > 0), float32 NCHW ----
  // The algorithm is cuDNN's heuristic first choice for the shape whose workspace fits (cached per
  // shape); the workspace is stream-ordered memory of the call, so these calls may be captured.
  // y = conv(x, w) (+ bias per output channel when bias is not null).
  virtual Status convForward(int dev, const ConvShape& s, const float* x, const float* w, const float* bias,
                             float* y) noexcept = 0;
  // dx = the gradient of the input from dy (overwrites dx).
  virtual Status convBackwardData(int dev, const ConvShape& s, const float* dy, const float* w,
                                  float* dx) noexcept = 0;
  // dw += the weight gradient; db += the bias gradient when db is not null (accumulates, as every
  // parameter gradient of the engine).
  virtual Status convBackwardFilter(int dev, const ConvShape& s, const float* x, const float* dy, float* dw,
                                    float* db) noexcept = 0;
  virtual Status poolForward(int dev, const PoolShape& s, const float* x, float* y) noexcept = 0;
  // dx (overwritten) from dy; x and y are the forward's input and output (max pooling's argmax).
  virtual Status poolBackward(int dev, const PoolShape& s, const float* x, const float* y, const float* dy,
                              float* dx) noexcept = 0;

  // ---- batch normalisation over x (n, c, s) float32, s the spatial size (1 for (N, C)) ----
  // Our own kernels, not cuDNN's: SyncBatchNorm all-reduces the per-channel sums between the steps,
  // as the CPU module does. Statistics are float64 in device memory, c values each unless said.
  // sums[ch] = sum of x[:, ch, :]; sums[c] = n * s (the count, so one all-reduce carries both).
  virtual Status channelSums(int dev, const float* x, int64_t n, int64_t c, int64_t s, double* sums) noexcept = 0;
  // squares[ch] = sum of (x[:, ch, :] - mean)^2, mean = sums[ch] / sums[c] (sums as channelSums wrote,
  // possibly all-reduced).
  virtual Status channelSquaredDeviations(int dev, const float* x, int64_t n, int64_t c, int64_t s,
                                          const double* sums, double* squares) noexcept = 0;
  // Training: mean = sums / count, var = squares / count, invstd = 1 / sqrt(var + eps); the running
  // statistics take momentum of mean and of var * count / (count - 1); *batchesTracked += 1.
  // Eval (sums null): mean = runningMean, invstd = 1 / sqrt(runningVar + eps); nothing else changes.
  virtual Status batchNormStatistics(int dev, int64_t c, const double* sums, const double* squares, double eps,
                                     double momentum, float* runningMean, float* runningVar,
                                     int64_t* batchesTracked, double* mean, double* invstd) noexcept = 0;
  // y = (x - mean) invstd weight + bias, per channel.
  virtual Status batchNormApply(int dev, const float* x, float* y, int64_t n, int64_t c, int64_t s,
                                const float* weight, const float* bias, const double* mean,
                                const double* invstd) noexcept = 0;
  // gradSums[ch] = sum of dy, gradSums[c + ch] = sum of dy (x - mean) invstd (2c values); then
  // dweight += gradSums[c + ch], dbias += gradSums[ch] (either may be null: not accumulated).
  virtual Status batchNormGradSums(int dev, const float* x, const float* dy, int64_t n, int64_t c, int64_t s,
                                   const double* mean, const double* invstd, double* gradSums, float* dweight,
                                   float* dbias) noexcept = 0;
  // dx = k (dy - mean(dy) - xhat mean(dy xhat)), k = weight invstd, the means over `count` values
  // (gradSums possibly all-reduced; count a device double, the sums[c] of the forward). Eval
  // statistics (count null): dx = k dy.
  virtual Status batchNormBackward(int dev, const float* x, const float* dy, float* dx, int64_t n, int64_t c,
                                   int64_t s, const float* weight, const double* mean, const double* invstd,
                                   const double* gradSums, const double* count) noexcept = 0;
  // mask[i] = (uniform(seed, i) < keep) ? 1/keep : 0; y = x * mask. Counter-based RNG: the same seed
  // gives the same mask. `seedOnDevice` not null: the seed is read from there (dev's memory) when the
  // kernel runs, for a graph that replays with a new seed each time (as the optimizers' scalars).
  virtual Status dropoutForward(int dev, const float* x, float* y, float* mask, int64_t n, float keep,
                                uint64_t seed, const uint64_t* seedOnDevice) noexcept = 0;
  virtual Status softmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols) noexcept = 0;
  // dx = y * (g - sum_c g * y), per row.
  virtual Status softmaxBackward(int dev, const float* y, const float* g, float* dx, int64_t rows,
                                 int64_t cols) noexcept = 0;
  // Softmax cross-entropy over rows of `logits`; the target is either `labels` (int64 class indices,
  // already range-checked, or equal to `ignoreIndex`: kNoIgnoreIndex when none) or `probs` (float32
  // rows); the other is null. Forward adds scale * (sum of the row losses, ignored rows left out) into
  // `*sum`, a double in dev's memory: no host read, so a training loop can accumulate a whole epoch on
  // the device (scale = 1 / rows gives the batch mean). Backward writes d(mean)/d(logits) into `grad`:
  // the mean over the rows not ignored, counted on the device (so a captured step replays right for any
  // batch), and 0 on the ignored rows.
  virtual Status crossEntropyForward(int dev, const float* logits, const int64_t* labels, const float* probs,
                                     int64_t rows, int64_t classes, int64_t ignoreIndex, double scale,
                                     double* sum) noexcept = 0;
  virtual Status crossEntropyBackward(int dev, const float* logits, const int64_t* labels, const float* probs,
                                      float* grad, int64_t rows, int64_t classes, int64_t ignoreIndex) noexcept = 0;
  // `*sum` (device) += scale * sum((y - t)^2); grad = 2 (y - t) / n.
  virtual Status mseForward(int dev, const float* y, const float* t, int64_t n, double scale, double* sum) noexcept = 0;
  virtual Status mseBackward(int dev, const float* y, const float* t, float* grad, int64_t n) noexcept = 0;
  // `*sum` (device) += the rows whose argmax (first maximum) equals the label / the target row's argmax;
  // a row whose label is `ignoreIndex` counts neither way.
  virtual Status countCorrect(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                              int64_t classes, int64_t ignoreIndex, double* sum) noexcept = 0;
  // A linear layer's forward in one call: y = x w^T (+ bias) (then ReLU when `relu`), with x (rows, in),
  // w (out, in) and y (rows, out) row-major and bias (out) or null. One cuBLASLt matmul with a BIAS /
  // RELU_BIAS epilogue where cuBLASLt offers one for the shape, else GEMM, bias and ReLU kernels:
  // the result is the same either way up to float32 rounding of the GEMM.
  virtual Status linearForward(int dev, const float* x, const float* w, const float* bias, float* y, int64_t rows,
                               int64_t in, int64_t out, bool relu) noexcept = 0;
  // n elements of `in` into `out`, one of the two Float32 and the other Float16 or BFloat16 (DDP's
  // 16-bit gradient exchange). Narrowing: out = round(in * scale) to nearest, ties to even (float16
  // beyond 65520 becomes Inf; NaN stays NaN, sign kept, and is never scaled). Widening is exact and
  // takes scale 1. The bits equal the host's conversions (cyxwiz/tensor/half.h).
  virtual Status convertFloats(int dev, const void* in, ElemType inType, void* out, ElemType outType, int64_t n,
                               float scale) noexcept = 0;

  // ---- mixed precision (autocast, nn/autocast.h): 16-bit operands, float32 results ----
  // `type` is ElemType::Float16 or BFloat16 for every 16-bit buffer of a call (uint16_t elements,
  // written by convertFloats). The GEMMs are cuBLASLt matmuls with CUBLAS_COMPUTE_32F: products of
  // the 16-bit values accumulated in float32 (tensor cores), as the CPU path (nn/linear16.cpp)
  // accumulates the exactly widened values.
  // C (float32) = alpha * op(A) op(B) + beta * C, row-major as gemm, A and B 16-bit.
  virtual Status gemm16(int dev, ElemType type, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                        float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c,
                        int64_t ldc) noexcept = 0;
  // linearForward with x (rows, in) and w (out, in) 16-bit; bias and y float32. One cuBLASLt matmul
  // with a BIAS / RELU_BIAS epilogue where cuBLASLt offers one, else bias, gemm16 and ReLU kernels.
  virtual Status linearForward16(int dev, ElemType type, const void* x, const void* w, const float* bias, float* y,
                                 int64_t rows, int64_t in, int64_t out, bool relu) noexcept = 0;
  // dx = x > 0 ? g : 0 with x the 16-bit copy a ReLU kept (its sign after rounding, as on the CPU).
  virtual Status reluBackward16(int dev, ElemType type, const void* x, const float* g, float* dx,
                                int64_t n) noexcept = 0;
  // out[j] += sum_r widen(g[r, j]), g (rows, cols) 16-bit: a bias gradient from the rounded gradient.
  virtual Status addColumnSums16(int dev, ElemType type, const void* g, float* out, int64_t rows,
                                 int64_t cols) noexcept = 0;
  // out = in * factor (in place when out == in); when `nonFinite` (a float in dev's memory) is not
  // null, it is set to 1 if any result is Inf or NaN and left alone otherwise (GradScaler's unscale
  // and check: the caller zeroes it once, scales every gradient, reads it back once).
  virtual Status scaleFloats(int dev, const float* in, float* out, int64_t n, float factor,
                             float* nonFinite) noexcept = 0;

  // ---- sequence layers (nn/embedding.cpp, layernorm.cpp, attention_gpu.cpp), float32 ----
  // C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, row-major as gemm, X_i = x + i * strideX
  // (elements): one cuBLAS strided batched GEMM (attention's per-head products on strided views).
  virtual Status gemmStridedBatched(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                                    const float* a, int64_t lda, int64_t strideA, const float* b, int64_t ldb,
                                    int64_t strideB, float beta, float* c, int64_t ldc, int64_t strideC,
                                    int64_t batch) noexcept = 0;
  // out[i, :] = table[ids[i], :] for i < count; ids of `idType` Int64, Int32 or Float32 (whole
  // numbers). An id outside [0, vocab) (or a float that is not a whole number) gives a zero row and,
  // when `firstBad` (one int64 in dev's memory) is not null, *firstBad = the smallest such position,
  // or count when there is none: the engine reads it back to raise its error (a device flag, so a
  // captured graph may pass null and read nothing on the host).
  virtual Status embeddingForward(int dev, const void* ids, ElemType idType, const float* table, float* out,
                                  int64_t count, int64_t vocab, int64_t dim, int64_t* firstBad) noexcept = 0;
  // dtable[ids[i], :] += g[i, :], deterministic: every (row, column) of dtable is summed by one
  // thread in position order (the CPU module's order, so the same float32 sums); invalid ids skipped.
  virtual Status embeddingBackward(int dev, const void* ids, ElemType idType, const float* g, float* dtable,
                                   int64_t count, int64_t vocab, int64_t dim) noexcept = 0;
  // Per row of x (rows, dim): mean and 1/sqrt(biased var + eps) from two passes in double (stored as
  // float, rows each), y = (x - mean) rstd weight + bias (nn/layernorm.cpp's formulas).
  virtual Status layerNormForward(int dev, const float* x, const float* weight, const float* bias, float* y,
                                  float* mean, float* rstd, int64_t rows, int64_t dim, double eps) noexcept = 0;
  // dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)) per row (dx may be null: not computed), and
  // dweight += sum_rows dy xhat, dbias += sum_rows dy (either may be null), summed in double over
  // fixed row chunks then the chunks in order: deterministic.
  virtual Status layerNormBackward(int dev, const float* x, const float* dy, const float* weight, const float* mean,
                                   const float* rstd, float* dx, float* dweight, float* dbias, int64_t rows,
                                   int64_t dim) noexcept = 0;
  // Softmax of each row of x (rows, cols) into y (y may be x). causal: row r is query r % cols of a
  // square (cols x cols) score matrix and sees the keys 0..r % cols only; the others get 0.
  virtual Status maskedSoftmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols,
                                      bool causal) noexcept = 0;
  // Whether dev's compute stream is being captured (graphBeginCapture): a layer then skips what needs
  // the host (the embedding's id check).
  virtual bool capturing(int dev) noexcept = 0;

  // ---- fused optimizers, all `count` parameters in one launch (formulas as nn/sgd.cpp, nn/adam.cpp) ----
  // The per-step scalars come either as arguments or, when `scalars` is not null, from device memory
  // on dev, read by the kernel when it runs: a captured graph replays its kernels with the arguments
  // of the capture, so a graphed step keeps what changes between steps in memory it rewrites before
  // each replay. sgd: scalars = {lr}. adam: scalars = {stepSize, invSqrtBc2, decay}.
  // m null: p -= lr (g + wd p). Else m = mu m + (g + wd p); p -= lr (nesterov ? g' + mu m : m).
  virtual Status sgdStep(int dev, const OptimizerTensor* tensors, int count, float lr, float momentum,
                         float weightDecay, bool nesterov, const float* scalars) noexcept = 0;
  // g' = g + l2 p; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2; p = p decay - stepSize m / (sqrt(v) invSqrtBc2 + eps).
  virtual Status adamStep(int dev, const OptimizerTensor* tensors, int count, float stepSize, float b1, float b2,
                          float eps, float invSqrtBc2, float l2, float decay, const float* scalars) noexcept = 0;

  // ---- CUDA graphs of the compute stream ----
  // Between begin and end, dev's compute stream (and the communication stream, once it waits for
  // the compute stream) records instead of running. Allowed while capturing: kernels, device-to-device
  // copies, malloc/free (memory allocated in the capture must be freed in it), collectives and the
  // events between the two streams (computeWaitsFor). Not allowed: host copies, synchronize, query,
  // eventQuery; they fail and invalidate the capture, and graphEndCapture then fails too.
  virtual Status graphBeginCapture(int dev) noexcept = 0;
  virtual Status graphEndCapture(int dev, void** graphExec) noexcept = 0;
  // Enqueues one replay on dev's compute stream.
  virtual Status graphLaunch(int dev, void* graphExec) noexcept = 0;
  virtual void graphDestroy(void* graphExec) noexcept = 0;
  // An event recorded on dev's compute stream after everything enqueued so far (poll it with
  // eventQuery: a bounded wait for a replay that contains collectives).
  virtual Status recordComputeEvent(int dev, void** event) noexcept = 0;

  // ---- events between the compute and the communication stream ----
  // Records an event on dev's compute stream and makes its communication stream wait for it.
  virtual Status commWaitsForCompute(int dev) noexcept = 0;
  // Makes dev's compute stream wait for `event` (from a collective).
  virtual Status computeWaitsFor(int dev, void* event) noexcept = 0;
  // Makes dev's compute stream wait for the work queued so far on another library's stream (the
  // `stream` of a __cuda_array_interface__: 1 and 2 are the legacy and per-thread default streams).
  virtual Status computeWaitsForStream(int dev, uintptr_t stream) noexcept = 0;
  virtual Status eventQuery(void* event, bool* done) noexcept = 0;
  virtual void eventRelease(void* event) noexcept = 0;

  // ---- NCCL (communicators are non-blocking: poll after init and after each call) ----
  virtual Status ncclUniqueId(std::string* id) noexcept = 0;  // NCCL_UNIQUE_ID_BYTES bytes
  // Starts ncclCommInitRankConfig(blocking=0) on `dev`; poll ncclState until ready.
  virtual Status ncclInit(int dev, int nranks, int rank, const std::string& id, void** comm) noexcept = 0;
  // *inProgress: an operation (init or the last collective) is still being set up. A failure on the
  // communicator (a peer gone, an abort) returns its error.
  virtual Status ncclState(void* comm, bool* inProgress) noexcept = 0;
  // Enqueues a collective on dev's communication stream (call commWaitsForCompute first). A
  // non-blocking communicator may still be enqueuing when this returns: poll ncclState until it is
  // not in progress, then recordCommEvent. AllGather: recv holds nranks * count elements.
  // ReduceScatter: send holds nranks * count, recv count. Broadcast: root's send into every recv.
  virtual Status ncclCollective(void* comm, int dev, CollectiveKind kind, const void* send, void* recv, size_t count,
                                ElemType type, ReduceKind op, int root) noexcept = 0;
  // An event recorded on dev's communication stream after everything enqueued so far.
  virtual Status recordCommEvent(int dev, void** event) noexcept = 0;
  // Aborts in-flight work: every rank's blocked kernels return, the communicator is unusable after.
  virtual void ncclAbort(void* comm) noexcept = 0;
  // Finalizes (bounded wait) and destroys; aborts instead when finalizing does not finish.
  virtual void ncclDestroy(void* comm) noexcept = 0;
};

}  // namespace cyxwiz::cuda

// The one symbol libcyxwiz_cuda.so exports: a process-wide Api, or null with `*error` set.
extern "C" cyxwiz::cuda::Api* cyxwiz_cuda_api(int expectedVersion, const char** error);
