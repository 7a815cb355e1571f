// LayerNormModule over rows of `dim` features (nn/layernorm.cpp's math, kernel_math.h's functions):
// a block per row for the statistics, the output and the input gradient (block sums in double, a
// fixed order), and two-pass chunked column sums for the parameters' gradients (launch.h). The
// ApiImpl methods are in ops_layernorm.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

__global__ void layerNormForwardKernel(const float* x, const float* weight, const float* bias, float* y, float* mean,
                                       float* rstd, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i];
    sum = blockSum(sum);
    const double m = sum / static_cast<double>(dim);
    double squares = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) squares += squaredDeviation(xr[i], m);
    const RowStatistics st = layerNormStatistics(sum, blockSum(squares), dim, eps);
    float* yr = y + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      yr[i] = layerNormElement(xr[i], st.mean, st.rstd, weight[i], bias[i]);
    }
    if (threadIdx.x == 0) {
      mean[r] = st.mean;
      rstd[r] = st.rstd;
    }
  }
}

__global__ void layerNormBackwardInputKernel(const float* x, const float* dy, const float* weight, const float* mean,
                                             const float* rstd, float* dx, int64_t rows, int64_t dim) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    const float* gr = dy + r * dim;
    const float m = mean[r], s = rstd[r];
    double sumGw = 0.0, sumGwXhat = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const double gw = layerNormGw(gr[i], weight[i]);
      sumGw += gw;
      sumGwXhat += gw * layerNormXhat(xr[i], m, s);
    }
    sumGw = blockSum(sumGw);
    sumGwXhat = blockSum(sumGwXhat);
    const float meanGw = static_cast<float>(sumGw / static_cast<double>(dim));
    const float meanGwXhat = static_cast<float>(sumGwXhat / static_cast<double>(dim));
    float* dr = dx + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      dr[i] = layerNormGradElement(xr[i], gr[i], weight[i], m, s, meanGw, meanGwXhat);
    }
  }
}

// Thread (column, chunk blockIdx.y): its chunk's rows in order.
__global__ void layerNormGradPartialsKernel(const float* x, const float* dy, const float* mean, const float* rstd,
                                            int64_t rows, int64_t dim, int64_t chunkRows, double* partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t first = chunk * chunkRows, last = first + chunkRows < rows ? first + chunkRows : rows;
  double dw = 0.0, db = 0.0;
  for (int64_t r = first; r < last; ++r) {
    const float g = dy[r * dim + j];
    dw += layerNormWeightTerm(x[r * dim + j], g, mean[r], rstd[r]);
    db += g;
  }
  partial[chunk * dim + j] = dw;
  partial[(chunks + chunk) * dim + j] = db;
}

__global__ void finishLayerNormGradKernel(const double* partial, int64_t chunks, int64_t dim, float* dweight,
                                          float* dbias) {
  for (int64_t j = globalIndex(); j < dim; j += globalStride()) {
    double dw = 0.0, db = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      dw += partial[c * dim + j];
      db += partial[(chunks + c) * dim + j];
    }
    if (dweight) dweight[j] += static_cast<float>(dw);
    if (dbias) dbias[j] += static_cast<float>(db);
  }
}

}  // namespace

void launchLayerNormForward(cudaStream_t s, const float* x, const float* weight, const float* bias, float* y,
                            float* mean, float* rstd, int64_t rows, int64_t dim, double eps) {
  layerNormForwardKernel<<<gridFor(rows, 1), rowThreads(dim), 0, s>>>(x, weight, bias, y, mean, rstd, rows, dim, eps);
}

void launchLayerNormBackwardInput(cudaStream_t s, const float* x, const float* dy, const float* weight,
                                  const float* mean, const float* rstd, float* dx, int64_t rows, int64_t dim) {
  layerNormBackwardInputKernel<<<gridFor(rows, 1), rowThreads(dim), 0, s>>>(x, dy, weight, mean, rstd, dx, rows, dim);
}

void launchLayerNormGradPartials(cudaStream_t s, const float* x, const float* dy, const float* mean, const float* rstd,
                                 int64_t rows, int64_t dim, double* partial) {
  const int threads = rowThreads(dim);
  const dim3 grid(static_cast<unsigned>((dim + threads - 1) / threads), static_cast<unsigned>(layerNormChunks(rows)));
  layerNormGradPartialsKernel<<<grid, threads, 0, s>>>(x, dy, mean, rstd, rows, dim, layerNormChunkRows(rows), partial);
}

void launchFinishLayerNormGrad(cudaStream_t s, const double* partial, int64_t chunks, int64_t dim, float* dweight,
                               float* dbias) {
  finishLayerNormGradKernel<<<gridFor(dim), kThreads, 0, s>>>(partial, chunks, dim, dweight, dbias);
}

}  // namespace cyxwiz::cuda
