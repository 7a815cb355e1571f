// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_convert.cu on the host: the
// same kernel_math.h functions (bit for bit cyxwiz/tensor/half.h), queued on the stream.
#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::reads;
using emulated::writes;

namespace {

template <ElemType T>
void enqueueNarrow(cudaStream_t s, const float* in, uint16_t* out, int64_t n, float scale) {
  cxemu::enqueue(s, "narrowKernel", {reads(in, n), writes(out, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) narrowElement<T>(in, out, i, scale);
  });
}

template <ElemType T>
void enqueueWiden(cudaStream_t s, const uint16_t* in, float* out, int64_t n) {
  cxemu::enqueue(s, "widenKernel", {reads(in, n), writes(out, n)}, [=] {
    for (int64_t i = 0; i < n; ++i) widenElement<T>(in, out, i);
  });
}

}  // namespace

void launchNarrowFloats(cudaStream_t s, const float* in, uint16_t* out, int64_t n, ElemType wire, float scale) {
  if (wire == ElemType::BFloat16) {
    enqueueNarrow<ElemType::BFloat16>(s, in, out, n, scale);
  } else {
    enqueueNarrow<ElemType::Float16>(s, in, out, n, scale);
  }
}

void launchWidenFloats(cudaStream_t s, const uint16_t* in, float* out, int64_t n, ElemType wire) {
  if (wire == ElemType::BFloat16) {
    enqueueWiden<ElemType::BFloat16>(s, in, out, n);
  } else {
    enqueueWiden<ElemType::Float16>(s, in, out, n);
  }
}

}  // namespace cyxwiz::cuda
