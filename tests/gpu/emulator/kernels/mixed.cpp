// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_mixed.cu on the host: the
// same kernel_math.h functions, queued on the stream.
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

template <ElemType T>
void enqueueReluBackward16(cudaStream_t s, const uint16_t* x, const float* g, float* dx, int64_t n) {
  cxemu::enqueue(s, "reluBackward16Kernel", {reads(x, n), reads(g, n), writes(dx, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) reluBackward16Element<T>(x, g, dx, i);
  });
}

}  // namespace

void launchReluBackward16(cudaStream_t s, ElemType type, const uint16_t* x, const float* g, float* dx, int64_t n) {
  if (type == ElemType::BFloat16) {
    enqueueReluBackward16<ElemType::BFloat16>(s, x, g, dx, n);
  } else {
    enqueueReluBackward16<ElemType::Float16>(s, x, g, dx, n);
  }
}

void launchScaleFloats(cudaStream_t s, const float* in, float* out, int64_t n, float factor, float* nonFinite) {
  // in == out (in place) is declared once, as a write: two ranges of one buffer are one access.
  std::vector<cxemu::Access> access{writes(out, n)};
  if (in != out) access.push_back(reads(in, n));
  if (nonFinite) access.push_back(writes(nonFinite, 1));
  cxemu::enqueue(s, "scaleFloatsKernel", std::move(access), [=] {
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) bad |= scaleElement(in, out, i, factor);
    if (bad && nonFinite) *nonFinite = 1.0f;
  });
}

}  // namespace cyxwiz::cuda
