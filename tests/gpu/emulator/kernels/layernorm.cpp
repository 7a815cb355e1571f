// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_layernorm.cu on the host: the
// same kernel_math.h functions, the row sums replayed as a block of rowThreads(dim) threads in the
// GPU's order (block.h), the parameters' gradients as the kernels' chunks (launch.h).
#include <algorithm>
#include <utility>
#include <vector>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "kernels/block.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::blockStridedSum;
using emulated::reads;
using emulated::writes;

void launchLayerNormForward(cudaStream_t s, const float* x, const float* weight, const float* bias, float* y,
                            float* mean, float* rstd, int64_t rows, int64_t dim, double eps) {
  cxemu::enqueue(s, "layerNormForwardKernel",
                 {reads(x, rows * dim), reads(weight, dim), reads(bias, dim), writes(y, rows * dim),
                  writes(mean, rows), writes(rstd, rows)},
                 [=] {
                   const int threads = rowThreads(dim);
                   for (int64_t r = 0; r < rows; ++r) {
                     const float* xr = x + r * dim;
                     const double sum = blockStridedSum<double>(threads, dim, [&](int64_t i) { return double(xr[i]); });
                     const double m = sum / static_cast<double>(dim);
                     const double squares =
                         blockStridedSum<double>(threads, dim, [&](int64_t i) { return squaredDeviation(xr[i], m); });
                     const RowStatistics st = layerNormStatistics(sum, squares, dim, eps);
                     for (int64_t i = 0; i < dim; ++i) {
                       y[r * dim + i] = layerNormElement(xr[i], st.mean, st.rstd, weight[i], bias[i]);
                     }
                     mean[r] = st.mean;
                     rstd[r] = st.rstd;
                   }
                 });
}

void launchLayerNormBackwardInput(cudaStream_t s, const float* x, const float* dy, const float* weight,
                                  const float* mean, const float* rstd, float* dx, int64_t rows, int64_t dim) {
  cxemu::enqueue(s, "layerNormBackwardInputKernel",
                 {reads(x, rows * dim), reads(dy, rows * dim), reads(weight, dim), reads(mean, rows),
                  reads(rstd, rows), writes(dx, rows * dim)},
                 [=] {
                   const int threads = rowThreads(dim);
                   for (int64_t r = 0; r < rows; ++r) {
                     const float* xr = x + r * dim;
                     const float* gr = dy + r * dim;
                     const float m = mean[r], sd = rstd[r];
                     const double sumGw =
                         blockStridedSum<double>(threads, dim, [&](int64_t i) { return layerNormGw(gr[i], weight[i]); });
                     const double sumGwXhat = blockStridedSum<double>(threads, dim, [&](int64_t i) {
                       return layerNormGw(gr[i], weight[i]) * layerNormXhat(xr[i], m, sd);
                     });
                     const float meanGw = static_cast<float>(sumGw / static_cast<double>(dim));
                     const float meanGwXhat = static_cast<float>(sumGwXhat / static_cast<double>(dim));
                     for (int64_t i = 0; i < dim; ++i) {
                       dx[r * dim + i] = layerNormGradElement(xr[i], gr[i], weight[i], m, sd, meanGw, meanGwXhat);
                     }
                   }
                 });
}

void launchLayerNormGradPartials(cudaStream_t s, const float* x, const float* dy, const float* mean, const float* rstd,
                                 int64_t rows, int64_t dim, double* partial) {
  const int64_t chunks = layerNormChunks(rows), chunkRows = layerNormChunkRows(rows);
  cxemu::enqueue(s, "layerNormGradPartialsKernel",
                 {reads(x, rows * dim), reads(dy, rows * dim), reads(mean, rows), reads(rstd, rows),
                  writes(partial, 2 * chunks * dim)},
                 [=] {
                   for (int64_t c = 0; c < chunks; ++c) {
                     const int64_t first = c * chunkRows, last = std::min(rows, first + chunkRows);
                     for (int64_t j = 0; j < dim; ++j) {
                       double dw = 0.0, db = 0.0;
                       for (int64_t r = first; r < last; ++r) {
                         const float g = dy[r * dim + j];
                         dw += layerNormWeightTerm(x[r * dim + j], g, mean[r], rstd[r]);
                         db += g;
                       }
                       partial[c * dim + j] = dw;
                       partial[(chunks + c) * dim + j] = db;
                     }
                   }
                 });
}

void launchFinishLayerNormGrad(cudaStream_t s, const double* partial, int64_t chunks, int64_t dim, float* dweight,
                               float* dbias) {
  std::vector<cxemu::Access> access{reads(partial, 2 * chunks * dim)};
  if (dweight) access.push_back(writes(dweight, dim));
  if (dbias) access.push_back(writes(dbias, dim));
  cxemu::enqueue(s, "finishLayerNormGradKernel", std::move(access), [=] {
    for (int64_t j = 0; j < dim; ++j) {
      double dw = 0.0, db = 0.0;
      for (int64_t c = 0; c < chunks; ++c) {
        dw += partial[c * dim + j];
        db += partial[(chunks + c) * dim + j];
      }
      if (dweight) dweight[j] += static_cast<float>(dw);
      if (dbias) dbias[j] += static_cast<float>(db);
    }
  });
}

}  // namespace cyxwiz::cuda
