// EmbeddingModule's gather and its deterministic scatter-add (nn/embedding.cpp's math, kernel_math.h's
// tokenId); launch.h explains the grids. The ApiImpl methods are in ops_embedding.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

__global__ void resetFirstBadKernel(int64_t* firstBad, int64_t count) { *firstBad = count; }

__global__ void embeddingForwardKernel(const void* ids, ElemType idType, const float* table, float* out, int64_t count,
                                       int64_t vocab, int64_t dim, int64_t* firstBad) {
  for (int64_t r = blockIdx.x; r < count; r += gridDim.x) {
    const int64_t id = tokenId(ids, idType, r, vocab);
    if (id < 0 && firstBad && threadIdx.x == 0) {
      atomicMin(reinterpret_cast<long long*>(firstBad), static_cast<long long>(r));
    }
    float* row = out + r * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) row[d] = embeddingElement(table, id, dim, d);
  }
}

// Thread (column d, slice s): the ids in [s * per, (s + 1) * per), every position in order.
__global__ void embeddingBackwardKernel(const void* ids, ElemType idType, const float* g, float* dtable, int64_t count,
                                        int64_t vocab, int64_t dim, int64_t per) {
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= dim) return;
  const int64_t lo = static_cast<int64_t>(blockIdx.y) * per, hi = lo + per;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t id = tokenId(ids, idType, i, vocab);
    if (id >= lo && id < hi) dtable[id * dim + d] += g[i * dim + d];
  }
}

}  // namespace

void launchEmbeddingForward(cudaStream_t s, const void* ids, ElemType idType, const float* table, float* out,
                            int64_t count, int64_t vocab, int64_t dim, int64_t* firstBad) {
  if (firstBad) resetFirstBadKernel<<<1, 1, 0, s>>>(firstBad, count);
  embeddingForwardKernel<<<gridFor(count, 1), rowThreads(dim), 0, s>>>(ids, idType, table, out, count, vocab, dim,
                                                                        firstBad);
}

void launchEmbeddingBackward(cudaStream_t s, const void* ids, ElemType idType, const float* g, float* dtable,
                             int64_t count, int64_t vocab, int64_t dim) {
  const int64_t slices = embeddingSlices(vocab, dim), per = (vocab + slices - 1) / slices;
  const int threads = rowThreads(dim);
  const dim3 grid(static_cast<unsigned>((dim + threads - 1) / threads), static_cast<unsigned>(slices));
  embeddingBackwardKernel<<<grid, threads, 0, s>>>(ids, idType, g, dtable, count, vocab, dim, per);
}

}  // namespace cyxwiz::cuda
