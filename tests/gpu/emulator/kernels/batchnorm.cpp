// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_batchnorm.cu on the host:
// the same kernel_math.h functions, queued on the stream through cxemu::enqueue. The first passes
// replay the GPU's order: block (p, ch)'s thread t walks channel ch's values from p * kThreads + t
// by splits * kThreads (ChannelWalk, the kernels' own index math), then blockSum (block.h); the
// finishes add each channel's partials in order (partialsSum).
#include <utility>
#include <vector>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "kernels/block.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::reads;
using emulated::writes;

namespace {

// partial[(q * c + ch) * splits + p] = block (p, ch)'s sum of term(q, ch, offset) for q < Q, offset
// the value's position relative to channel ch's first value (x + ch * sp).
template <int Q, class Term>
void channelPartials(int64_t n, int64_t c, int64_t sp, double* partial, int splits, Term term) {
  const int64_t count = n * sp, step = static_cast<int64_t>(splits) * kThreads;
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int p = 0; p < splits; ++p) {
      emulated::PerThread<double> acc[Q] = {};
      for (int t = 0; t < kThreads; ++t) {
        for (ChannelWalk w(static_cast<int64_t>(p) * kThreads + t, step, c, sp); w.e < count; w.next()) {
          for (int q = 0; q < Q; ++q) acc[q][t] += term(q, ch, w.offset());
        }
      }
      for (int q = 0; q < Q; ++q) partial[(q * c + ch) * splits + p] = emulated::blockSum(acc[q], kThreads);
    }
  }
}

}  // namespace

void launchChannelSumPartials(cudaStream_t s, const float* x, int64_t n, int64_t c, int64_t sp, double* partial,
                              int splits) {
  cxemu::enqueue(s, "channelSumKernel", {reads(x, n * c * sp), writes(partial, c * splits)}, [=] {
    channelPartials<1>(n, c, sp, partial, splits,
                       [&](int, int64_t ch, int64_t o) { return static_cast<double>(x[ch * sp + o]); });
  });
}

void launchChannelSquarePartials(cudaStream_t s, const float* x, int64_t n, int64_t c, int64_t sp, const double* sums,
                                 double* partial, int splits) {
  cxemu::enqueue(s, "channelSquareKernel", {reads(x, n * c * sp), reads(sums, c + 1), writes(partial, c * splits)},
                 [=] {
                   channelPartials<1>(n, c, sp, partial, splits, [&](int, int64_t ch, int64_t o) {
                     return squaredDeviation(x[ch * sp + o], sums[ch] / sums[c]);
                   });
                 });
}

void launchBatchNormGradPartials(cudaStream_t s, const float* x, const float* dy, int64_t n, int64_t c, int64_t sp,
                                 const double* mean, double* partial, int splits) {
  const int64_t total = n * c * sp;
  cxemu::enqueue(s, "batchNormGradPartialsKernel",
                 {reads(x, total), reads(dy, total), reads(mean, c), writes(partial, 2 * c * splits)}, [=] {
                   channelPartials<2>(n, c, sp, partial, splits, [&](int q, int64_t ch, int64_t o) {
                     const float d = dy[ch * sp + o];
                     return q == 0 ? static_cast<double>(d) : deviationProduct(d, x[ch * sp + o], mean[ch]);
                   });
                 });
}

void launchFinishChannelSums(cudaStream_t s, const double* partial, int splits, int64_t c, double* sums,
                             double count) {
  cxemu::enqueue(s, "finishChannelSumsKernel", {reads(partial, c * splits), writes(sums, c + 1)}, [=] {
    for (int64_t ch = 0; ch < c; ++ch) sums[ch] = partialsSum(partial, splits, ch);
    sums[c] = count;
  });
}

void launchFinishChannelSquares(cudaStream_t s, const double* partial, int splits, int64_t c, double* squares) {
  cxemu::enqueue(s, "finishChannelSquaresKernel", {reads(partial, c * splits), writes(squares, c)}, [=] {
    for (int64_t ch = 0; ch < c; ++ch) squares[ch] = partialsSum(partial, splits, ch);
  });
}

void launchFinishBatchNormGrad(cudaStream_t s, const double* partial, int splits, int64_t c, const double* invstd,
                               double* gradSums, float* dweight, float* dbias) {
  std::vector<cxemu::Access> access{reads(partial, 2 * c * splits), reads(invstd, c), writes(gradSums, 2 * c)};
  if (dweight) access.push_back(writes(dweight, c));
  if (dbias) access.push_back(writes(dbias, c));
  cxemu::enqueue(s, "finishBatchNormGradKernel", std::move(access), [=] {
    for (int64_t ch = 0; ch < c; ++ch) batchNormGradFinish(ch, c, partial, splits, invstd, gradSums, dweight, dbias);
  });
}

void launchBatchNormStatistics(cudaStream_t s, int64_t c, const double* sums, const double* squares, double eps,
                               double momentum, float* runningMean, float* runningVar, int64_t* batchesTracked,
                               double* mean, double* invstd) {
  std::vector<cxemu::Access> access{writes(mean, c), writes(invstd, c)};
  if (sums) {
    access.insert(access.end(), {reads(sums, c + 1), reads(squares, c), writes(runningMean, c),
                                 writes(runningVar, c), writes(batchesTracked, 1)});
  } else {
    access.insert(access.end(), {reads(runningMean, c), reads(runningVar, c)});
  }
  cxemu::enqueue(s, "batchNormStatisticsKernel", std::move(access), [=] {
    for (int64_t ch = 0; ch < c; ++ch) {
      if (sums) {
        batchNormTrainingStatistics(ch, c, sums, squares, eps, momentum, runningMean, runningVar, mean, invstd);
      } else {
        batchNormEvalStatistics(ch, eps, runningMean, runningVar, mean, invstd);
      }
    }
    if (sums) *batchesTracked += 1;
  });
}

// The element-wise passes do not depend on the order: plain loops over (i, ch, j).
void launchBatchNormApply(cudaStream_t s, const float* x, float* y, int64_t n, int64_t c, int64_t sp,
                          const float* weight, const float* bias, const double* mean, const double* invstd) {
  const int64_t total = n * c * sp;
  cxemu::enqueue(s, "batchNormApplyKernel",
                 {reads(x, total), writes(y, total), reads(weight, c), reads(bias, c), reads(mean, c),
                  reads(invstd, c)},
                 [=] {
                   for (int64_t ch = 0; ch < c; ++ch) {
                     const ChannelAffine a = batchNormAffine(weight[ch], bias[ch], mean[ch], invstd[ch]);
                     for (int64_t i = 0; i < n; ++i) {
                       const int64_t base = (i * c + ch) * sp;
                       for (int64_t j = 0; j < sp; ++j) y[base + j] = batchNormApplyElement(x[base + j], a);
                     }
                   }
                 });
}

void launchBatchNormBackward(cudaStream_t s, const float* x, const float* dy, float* dx, int64_t n, int64_t c,
                             int64_t sp, const float* weight, const double* mean, const double* invstd,
                             const double* gradSums, const double* count) {
  const int64_t total = n * c * sp;
  std::vector<cxemu::Access> access{reads(x, total),  reads(dy, total),   writes(dx, total),
                                    reads(weight, c), reads(mean, c),     reads(invstd, c)};
  if (count) access.insert(access.end(), {reads(gradSums, 2 * c), reads(count, 1)});
  cxemu::enqueue(s, "batchNormBackwardKernel", std::move(access), [=] {
    for (int64_t ch = 0; ch < c; ++ch) {
      const BatchNormGradCoefficients k =
          batchNormGradCoefficients(ch, c, weight[ch], mean[ch], invstd[ch], gradSums, count);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t base = (i * c + ch) * sp;
        for (int64_t j = 0; j < sp; ++j) dx[base + j] = batchNormGradElement(x[base + j], dy[base + j], k);
      }
    }
  });
}

}  // namespace cyxwiz::cuda
