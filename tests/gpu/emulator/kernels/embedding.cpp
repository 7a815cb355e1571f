// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_embedding.cu on the host: the
// same kernel_math.h functions (tokenId, embeddingElement) queued on the stream. The forward's
// atomicMin is a minimum, the same in any order; the backward adds each table element's gradients in
// position order, as the kernel's one thread per element does.
#include <algorithm>
#include <utility>
#include <vector>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::reads;
using emulated::writes;

namespace {

// The ids' bytes as the kernel reads them.
cxemu::Access readsIds(const void* ids, ElemType type, int64_t count) {
  const int64_t size = type == ElemType::Int64 ? 8 : 4;
  return cxemu::Access{ids, static_cast<size_t>(count * size), false};
}

}  // namespace

void launchEmbeddingForward(cudaStream_t s, const void* ids, ElemType idType, const float* table, float* out,
                            int64_t count, int64_t vocab, int64_t dim, int64_t* firstBad) {
  std::vector<cxemu::Access> access{readsIds(ids, idType, count), reads(table, vocab * dim), writes(out, count * dim)};
  if (firstBad) access.push_back(writes(firstBad, 1));
  cxemu::enqueue(s, "embeddingForwardKernel", std::move(access), [=] {
    int64_t bad = count;
    for (int64_t r = 0; r < count; ++r) {
      const int64_t id = tokenId(ids, idType, r, vocab);
      if (id < 0) bad = std::min(bad, r);
      for (int64_t d = 0; d < dim; ++d) out[r * dim + d] = embeddingElement(table, id, dim, d);
    }
    if (firstBad) *firstBad = bad;
  });
}

void launchEmbeddingBackward(cudaStream_t s, const void* ids, ElemType idType, const float* g, float* dtable,
                             int64_t count, int64_t vocab, int64_t dim) {
  cxemu::enqueue(s, "embeddingBackwardKernel",
                 {readsIds(ids, idType, count), reads(g, count * dim), writes(dtable, vocab * dim)}, [=] {
                   for (int64_t i = 0; i < count; ++i) {
                     const int64_t id = tokenId(ids, idType, i, vocab);
                     if (id < 0) continue;
                     for (int64_t d = 0; d < dim; ++d) dtable[id * dim + d] += g[i * dim + d];
                   }
                 });
}

}  // namespace cyxwiz::cuda
