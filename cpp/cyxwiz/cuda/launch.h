// One function per kernel launch, for the ApiImpl methods (ops_*.cpp, blas.cpp). The .cu files
// define them (grid sizing and the <<<>>>); the host emulator defines them again in
// tests/gpu/emulator/kernels, running kernel_math.h's functions as work queued on the stream. Like a
// <<<>>>, a launch reports nothing itself: its configuration error is the runtime's last error, read
// by launchStatus (errors.h).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda {

// ---- the launch configuration, shared so that the emulator replays the same partials ----

constexpr int kThreads = 256;

// Grid for a grid-stride loop over n elements: enough blocks to cover n, capped so that huge
// tensors loop instead of launching millions of blocks.
inline unsigned gridFor(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65536));
}

// Threads per block for one-block-per-row kernels: a warp for short rows, up to kThreads.
inline int rowThreads(int64_t cols) {
  int t = 32;
  while (t < kThreads && t < cols) t *= 2;
  return t;
}

// addColumnSums: a 32-column tile per block, kColumnSumRows thread rows each summing a strided
// subset of the rows, then one thread per column adding the partials in order.
constexpr int kColumnSumRows = 16;

// Blocks of a row reduction writing one partial each: one per row up to `capacity`, each then loops.
inline int rowPartials(int64_t rows, int capacity) { return static_cast<int>(std::min<int64_t>(rows, capacity)); }
// Blocks of squaredError: a grid-stride loop, at most `capacity` blocks.
inline int elementPartials(int64_t n, int capacity) {
  return static_cast<int>(std::min<int64_t>(gridFor(n), capacity));
}

// The fused optimizer steps launch kTensorsPerLaunch parameters at a time (by value in the kernel's
// arguments: 24 x 40 bytes, well inside the 4 KiB of kernel parameters). The caller batches.
constexpr int kTensorsPerLaunch = 24;

// ---- kernels_elementwise.cu (sizes > 0, as for every launch below) ----

void launchFill(cudaStream_t s, float* dst, int64_t n, float value);
void launchBroadcastRows(cudaStream_t s, const float* row, float* out, int64_t rows, int64_t cols);
void launchAddColumnSums(cudaStream_t s, const float* g, float* out, int64_t rows, int64_t cols);
void launchMultiply(cudaStream_t s, const float* a, const float* b, float* out, int64_t n);
void launchAdd(cudaStream_t s, const float* a, const float* b, float* out, int64_t n);
// f must be knownActivation (kernel_math.h); another launches nothing. `param`: see Activation.
void launchActivationForward(cudaStream_t s, Activation f, const float* x, float* y, int64_t n, float param);
void launchActivationBackward(cudaStream_t s, Activation f, const float* x, const float* g, float* dx, int64_t n,
                              float param);
void launchDropout(cudaStream_t s, const float* x, float* y, float* mask, int64_t n, float keep, float scale,
                   uint64_t seed, const uint64_t* seedOnDevice);

// ---- kernels_convert.cu: `wire` is ElemType::Float16 or BFloat16 ----

void launchNarrowFloats(cudaStream_t s, const float* in, uint16_t* out, int64_t n, ElemType wire, float scale);
void launchWidenFloats(cudaStream_t s, const uint16_t* in, float* out, int64_t n, ElemType wire);

// ---- autocast and GradScaler: `type` is ElemType::Float16 or BFloat16 ----

// kernels_elementwise.cu: addColumnSums over widen(g).
void launchAddColumnSums16(cudaStream_t s, ElemType type, const uint16_t* g, float* out, int64_t rows, int64_t cols);
// kernels_mixed.cu
void launchReluBackward16(cudaStream_t s, ElemType type, const uint16_t* x, const float* g, float* dx, int64_t n);
// out = in * factor; *nonFinite = 1 where a result is Inf/NaN (nonFinite may be null).
void launchScaleFloats(cudaStream_t s, const float* in, float* out, int64_t n, float factor, float* nonFinite);

// ---- kernels_loss.cu ----

void launchSoftmaxForward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols);
void launchSoftmaxBackward(cudaStream_t s, const float* y, const float* g, float* dx, int64_t rows, int64_t cols);
// The two-pass reductions: the first launch writes partial[0, count) and returns count (at most
// `capacity`); a finish launch then adds them, in a fixed order, onto *sum.
// Rows whose label is `ignore` (kNoIgnoreIndex: none) add nothing, to the loss or to the count.
int launchCrossEntropyPartials(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                               int64_t rows, int64_t classes, int64_t ignore, double* partial, int capacity);
int launchSquaredErrorPartials(cudaStream_t s, const float* y, const float* t, int64_t n, double* partial,
                               int capacity);
int launchCountCorrectPartials(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                               int64_t rows, int64_t classes, int64_t ignore, long long* partial, int capacity);
// *count = the labels not equal to `ignore` (one block, a fixed order).
void launchCountLabels(cudaStream_t s, const int64_t* labels, int64_t rows, int64_t ignore, long long* count);
// *sum += scale * (sum of partial[0, count)).
void launchFinishSum(cudaStream_t s, const double* partial, int count, double scale, double* sum);
// *sum += (sum of partial[0, count)).
void launchFinishCount(cudaStream_t s, const long long* partial, int count, double* sum);
// The mean's 1 / count is invRows, or 1 / max(*count, 1) read on the device when `count` is not null;
// rows whose label is `ignore` get 0.
void launchCrossEntropyBackward(cudaStream_t s, const float* logits, const int64_t* labels, const float* probs,
                                float* grad, int64_t rows, int64_t classes, int64_t ignore, float invRows,
                                const long long* count);
void launchMseBackward(cudaStream_t s, const float* y, const float* t, float* grad, int64_t n, float scale);

// ---- kernels_batchnorm.cu: x (n, c, s), per-channel statistics in double ----
//
// A grid of (splits, min(c, 65535)) blocks of kThreads: block (p, ch) takes the values p * kThreads
// + t, then a step of splits * kThreads further, of channel ch's n * s (ChannelWalk), for
// channels ch, ch + 65535, ... The reductions are two fixed-order passes: each block writes the
// blockSum of its threads' sums to partial[(q * c + ch) * splits + p] (q: the quantity, 2 for the
// gradient's), then one thread per channel adds its `splits` partials in order. Why not one block
// per channel: c = 64 channels of 256 x 1024 values would keep 64 blocks of 132 SMs busy, each
// with a long dependent loop; splitting fills the GPU and stays deterministic (splits depends on
// the shape only). With splits = 1 the first pass writes the result slots themselves.

// Blocks per channel of a reduction: ~16 values per thread, as many as `capacity` partials allow.
inline int channelSplits(int64_t perChannel, int64_t c, int quantities, int capacity) {
  const int64_t wanted = (perChannel + kThreads * 16 - 1) / (kThreads * 16);
  const int64_t room = capacity / (c * quantities);
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, room)));
}
// Blocks per channel of the element-wise passes (apply, backward): ~8 values per thread.
inline unsigned channelBlocks(int64_t perChannel) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((perChannel + kThreads * 8 - 1) / (kThreads * 8), 1),
                                                 65535));
}
constexpr int64_t kMaxGridY = 65535;

// First passes (`partial` holds quantities * c * splits doubles).
void launchChannelSumPartials(cudaStream_t s, const float* x, int64_t n, int64_t c, int64_t sp, double* partial,
                              int splits);
void launchChannelSquarePartials(cudaStream_t s, const float* x, int64_t n, int64_t c, int64_t sp, const double* sums,
                                 double* partial, int splits);
// Two quantities: dy, and dy (x - mean).
void launchBatchNormGradPartials(cudaStream_t s, const float* x, const float* dy, int64_t n, int64_t c, int64_t sp,
                                 const double* mean, double* partial, int splits);
// Finishes: out[ch] = the partials' sum (0 with splits = 0: no values, no first pass); channelSums
// also writes sums[c] = count.
void launchFinishChannelSums(cudaStream_t s, const double* partial, int splits, int64_t c, double* sums, double count);
void launchFinishChannelSquares(cudaStream_t s, const double* partial, int splits, int64_t c, double* squares);
// kernel_math.h's batchNormGradFinish per channel.
void launchFinishBatchNormGrad(cudaStream_t s, const double* partial, int splits, int64_t c, const double* invstd,
                               double* gradSums, float* dweight, float* dbias);
// One thread per channel; training when sums is not null (and then *batchesTracked += 1).
void launchBatchNormStatistics(cudaStream_t s, int64_t c, const double* sums, const double* squares, double eps,
                               double momentum, float* runningMean, float* runningVar, int64_t* batchesTracked,
                               double* mean, double* invstd);
void launchBatchNormApply(cudaStream_t s, const float* x, float* y, int64_t n, int64_t c, int64_t sp,
                          const float* weight, const float* bias, const double* mean, const double* invstd);
void launchBatchNormBackward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t n, int64_t c,
                             int64_t sp, const float* weight, const double* mean, const double* invstd,
                             const double* gradSums, const double* count);

// ---- the sequence layers (sizes > 0) ----

// kernels_embedding.cu. Forward: a block per position (rows of `dim` threads' loop); *firstBad is
// reset to count first, then lowered with atomicMin by each invalid position (a minimum: the same
// answer in any order). Backward: a thread per (column, vocabulary slice) scanning every position in
// order and adding those whose id lies in its slice, so each table element is summed by one thread in
// position order (deterministic, the CPU's order); about 64K threads.
inline int64_t embeddingSlices(int64_t vocab, int64_t dim) {
  const int64_t wanted = (65536 + dim - 1) / dim;
  return std::max<int64_t>(1, std::min<int64_t>({wanted, vocab, int64_t{65535}}));
}
void launchEmbeddingForward(cudaStream_t s, const void* ids, ElemType idType, const float* table, float* out,
                            int64_t count, int64_t vocab, int64_t dim, int64_t* firstBad);
void launchEmbeddingBackward(cudaStream_t s, const void* ids, ElemType idType, const float* g, float* dtable,
                             int64_t count, int64_t vocab, int64_t dim);

// kernels_layernorm.cu. Forward and dx: a block of rowThreads(dim) per row, block sums in double.
// The parameters' gradients: thread (column, chunk) sums its chunk's rows in order into
// partial[(q * chunks + chunk) * dim + column] (q: 0 the weight's, 1 the bias's), then one thread per
// column adds the chunks in order onto dweight / dbias.
inline int64_t layerNormChunkRows(int64_t rows) { return std::max<int64_t>(32, (rows + 4095) / 4096); }
inline int64_t layerNormChunks(int64_t rows) {
  const int64_t per = layerNormChunkRows(rows);
  return (rows + per - 1) / per;
}
void launchLayerNormForward(cudaStream_t s, const float* x, const float* weight, const float* bias, float* y,
                            float* mean, float* rstd, int64_t rows, int64_t dim, double eps);
void launchLayerNormBackwardInput(cudaStream_t s, const float* x, const float* dy, const float* weight,
                                  const float* mean, const float* rstd, float* dx, int64_t rows, int64_t dim);
// `partial` holds 2 * layerNormChunks(rows) * dim doubles; either output may be null.
void launchLayerNormGradPartials(cudaStream_t s, const float* x, const float* dy, const float* mean, const float* rstd,
                                 int64_t rows, int64_t dim, double* partial);
void launchFinishLayerNormGrad(cudaStream_t s, const double* partial, int64_t chunks, int64_t dim, float* dweight,
                               float* dbias);

// kernels_attention.cu: a block of rowThreads(cols) per row (y may be x).
void launchMaskedSoftmax(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols, bool causal);

// ---- kernels_optim.cu: count in [1, kTensorsPerLaunch], largest = the largest n among them (> 0) ----

void launchSgd(cudaStream_t s, const OptimizerTensor* tensors, int count, int64_t largest, float lr, float momentum,
               float weightDecay, bool nesterov, const float* scalars);
void launchAdam(cudaStream_t s, const OptimizerTensor* tensors, int count, int64_t largest, float stepSize, float b1,
                float b2, float eps, float invSqrtBc2, float l2, float decay, const float* scalars);

// ---- blas.cu: C = beta C (beta = 0 writes zeros) for a GEMM with k = 0, m x n with leading dimension ldc ----

void launchScaleMatrix(cudaStream_t s, float* c, int64_t m, int64_t n, int64_t ldc, float beta);

}  // namespace cyxwiz::cuda
