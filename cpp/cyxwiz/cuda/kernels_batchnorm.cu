// Batch normalisation over x (n, c, s): per-channel sums, squared deviations, statistics, the
// affine apply and the gradient (nn/batchnorm.cpp's math, kernel_math.h's functions). The
// reductions are deterministic two-pass ones in double (launch.h explains the grid); the ApiImpl
// methods are in ops_batchnorm.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

// Block (blockIdx.x, ch)'s walk over channel ch's values, as launch.h describes.
__device__ ChannelWalk blockWalk(int64_t c, int64_t sp) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  return ChannelWalk(static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, step, c, sp);
}

__device__ int64_t partialSlot(int64_t q, int64_t c, int64_t ch) { return ((q * c + ch) * gridDim.x) + blockIdx.x; }

__global__ void channelSumKernel(const float* x, int64_t n, int64_t c, int64_t sp, double* partial) {
  const int64_t count = n * sp;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    const float* xc = x + ch * sp;
    double acc = 0.0;
    ChannelWalk w = blockWalk(c, sp);
    for (; w.e < count; w.next()) acc += xc[w.offset()];
    acc = blockSum(acc);
    if (threadIdx.x == 0) partial[partialSlot(0, c, ch)] = acc;
  }
}

__global__ void channelSquareKernel(const float* x, int64_t n, int64_t c, int64_t sp, const double* sums,
                                    double* partial) {
  const int64_t count = n * sp;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    const float* xc = x + ch * sp;
    const double mean = sums[ch] / sums[c];
    double acc = 0.0;
    ChannelWalk w = blockWalk(c, sp);
    for (; w.e < count; w.next()) acc += squaredDeviation(xc[w.offset()], mean);
    acc = blockSum(acc);
    if (threadIdx.x == 0) partial[partialSlot(0, c, ch)] = acc;
  }
}

__global__ void batchNormGradPartialsKernel(const float* x, const float* dy, int64_t n, int64_t c, int64_t sp,
                                            const double* mean, double* partial) {
  const int64_t count = n * sp;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    const float* xc = x + ch * sp;
    const float* dc = dy + ch * sp;
    const double m = mean[ch];
    double sumDy = 0.0, sumDyX = 0.0;
    ChannelWalk w = blockWalk(c, sp);
    for (; w.e < count; w.next()) {
      const int64_t o = w.offset();
      const float d = dc[o];
      sumDy += d;
      sumDyX += deviationProduct(d, xc[o], m);
    }
    sumDy = blockSum(sumDy);
    sumDyX = blockSum(sumDyX);
    if (threadIdx.x == 0) {
      partial[partialSlot(0, c, ch)] = sumDy;
      partial[partialSlot(1, c, ch)] = sumDyX;
    }
  }
}

__global__ void finishChannelSumsKernel(const double* partial, int splits, int64_t c, double* sums, double count) {
  for (int64_t ch = globalIndex(); ch < c; ch += globalStride()) sums[ch] = partialsSum(partial, splits, ch);
  if (globalIndex() == 0) sums[c] = count;
}

__global__ void finishChannelSquaresKernel(const double* partial, int splits, int64_t c, double* squares) {
  for (int64_t ch = globalIndex(); ch < c; ch += globalStride()) squares[ch] = partialsSum(partial, splits, ch);
}

__global__ void finishBatchNormGradKernel(const double* partial, int splits, int64_t c, const double* invstd,
                                          double* gradSums, float* dweight, float* dbias) {
  for (int64_t ch = globalIndex(); ch < c; ch += globalStride()) {
    batchNormGradFinish(ch, c, partial, splits, invstd, gradSums, dweight, dbias);
  }
}

__global__ void batchNormStatisticsKernel(int64_t c, const double* sums, const double* squares, double eps,
                                          double momentum, float* runningMean, float* runningVar,
                                          int64_t* batchesTracked, double* mean, double* invstd) {
  for (int64_t ch = globalIndex(); ch < c; ch += globalStride()) {
    if (sums) {
      batchNormTrainingStatistics(ch, c, sums, squares, eps, momentum, runningMean, runningVar, mean, invstd);
    } else {
      batchNormEvalStatistics(ch, eps, runningMean, runningVar, mean, invstd);
    }
  }
  if (sums && globalIndex() == 0) *batchesTracked += 1;
}

__global__ void batchNormApplyKernel(const float* x, float* y, int64_t n, int64_t c, int64_t sp, const float* weight,
                                     const float* bias, const double* mean, const double* invstd) {
  const int64_t count = n * sp;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    const ChannelAffine a = batchNormAffine(weight[ch], bias[ch], mean[ch], invstd[ch]);
    const int64_t base = ch * sp;
    ChannelWalk w = blockWalk(c, sp);
    for (; w.e < count; w.next()) {
      const int64_t o = base + w.offset();
      y[o] = batchNormApplyElement(x[o], a);
    }
  }
}

__global__ void batchNormBackwardKernel(const float* x, const float* dy, float* dx, int64_t n, int64_t c, int64_t sp,
                                        const float* weight, const double* mean, const double* invstd,
                                        const double* gradSums, const double* count) {
  const int64_t total = n * sp;
  for (int64_t ch = blockIdx.y; ch < c; ch += gridDim.y) {
    const BatchNormGradCoefficients k =
        batchNormGradCoefficients(ch, c, weight[ch], mean[ch], invstd[ch], gradSums, count);
    const int64_t base = ch * sp;
    ChannelWalk w = blockWalk(c, sp);
    for (; w.e < total; w.next()) {
      const int64_t o = base + w.offset();
      dx[o] = batchNormGradElement(x[o], dy[o], k);
    }
  }
}

dim3 channelGrid(unsigned blocks, int64_t c) {
  return dim3(blocks, static_cast<unsigned>(std::min<int64_t>(c, kMaxGridY)));
}

}  // namespace

void launchChannelSumPartials(cudaStream_t s, const float* x, int64_t n, int64_t c, int64_t sp, double* partial,
                              int splits) {
  channelSumKernel<<<channelGrid(splits, c), kThreads, 0, s>>>(x, n, c, sp, partial);
}

void launchChannelSquarePartials(cudaStream_t s, const float* x, int64_t n, int64_t c, int64_t sp, const double* sums,
                                 double* partial, int splits) {
  channelSquareKernel<<<channelGrid(splits, c), kThreads, 0, s>>>(x, n, c, sp, sums, partial);
}

void launchBatchNormGradPartials(cudaStream_t s, const float* x, const float* dy, int64_t n, int64_t c, int64_t sp,
                                 const double* mean, double* partial, int splits) {
  batchNormGradPartialsKernel<<<channelGrid(splits, c), kThreads, 0, s>>>(x, dy, n, c, sp, mean, partial);
}

void launchFinishChannelSums(cudaStream_t s, const double* partial, int splits, int64_t c, double* sums,
                             double count) {
  finishChannelSumsKernel<<<gridFor(c), kThreads, 0, s>>>(partial, splits, c, sums, count);
}

void launchFinishChannelSquares(cudaStream_t s, const double* partial, int splits, int64_t c, double* squares) {
  finishChannelSquaresKernel<<<gridFor(c), kThreads, 0, s>>>(partial, splits, c, squares);
}

void launchFinishBatchNormGrad(cudaStream_t s, const double* partial, int splits, int64_t c, const double* invstd,
                               double* gradSums, float* dweight, float* dbias) {
  finishBatchNormGradKernel<<<gridFor(c), kThreads, 0, s>>>(partial, splits, c, invstd, gradSums, dweight, dbias);
}

void launchBatchNormStatistics(cudaStream_t s, int64_t c, const double* sums, const double* squares, double eps,
                               double momentum, float* runningMean, float* runningVar, int64_t* batchesTracked,
                               double* mean, double* invstd) {
  batchNormStatisticsKernel<<<gridFor(c), kThreads, 0, s>>>(c, sums, squares, eps, momentum, runningMean, runningVar,
                                                   batchesTracked, mean, invstd);
}

void launchBatchNormApply(cudaStream_t s, const float* x, float* y, int64_t n, int64_t c, int64_t sp,
                          const float* weight, const float* bias, const double* mean, const double* invstd) {
  const dim3 grid = channelGrid(channelBlocks(n * sp), c);
  batchNormApplyKernel<<<grid, kThreads, 0, s>>>(x, y, n, c, sp, weight, bias, mean, invstd);
}

void launchBatchNormBackward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t n, int64_t c,
                             int64_t sp, const float* weight, const double* mean, const double* invstd,
                             const double* gradSums, const double* count) {
  const dim3 grid = channelGrid(channelBlocks(n * sp), c);
  batchNormBackwardKernel<<<grid, kThreads, 0, s>>>(x, dy, dx, n, c, sp, weight, mean, invstd, gradSums, count);
}

}  // namespace cyxwiz::cuda
