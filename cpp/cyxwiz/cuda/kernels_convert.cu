// float32 <-> float16 / bfloat16 (DDP's 16-bit gradient exchange, ddp/wire.cpp): the per-element
// formulas are kernel_math.h's, bit for bit those of the host (cyxwiz/tensor/half.h); the ApiImpl
// method calling these launches is convertFloats in ops_elementwise.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

template <ElemType T>
__global__ void narrowKernel(const float* in, uint16_t* out, int64_t n, float scale) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) narrowElement<T>(in, out, i, scale);
}

template <ElemType T>
__global__ void widenKernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) widenElement<T>(in, out, i);
}

}  // namespace

void launchNarrowFloats(cudaStream_t s, const float* in, uint16_t* out, int64_t n, ElemType wire, float scale) {
  if (wire == ElemType::BFloat16) {
    narrowKernel<ElemType::BFloat16><<<gridFor(n), kThreads, 0, s>>>(in, out, n, scale);
  } else {
    narrowKernel<ElemType::Float16><<<gridFor(n), kThreads, 0, s>>>(in, out, n, scale);
  }
}

void launchWidenFloats(cudaStream_t s, const uint16_t* in, float* out, int64_t n, ElemType wire) {
  if (wire == ElemType::BFloat16) {
    widenKernel<ElemType::BFloat16><<<gridFor(n), kThreads, 0, s>>>(in, out, n);
  } else {
    widenKernel<ElemType::Float16><<<gridFor(n), kThreads, 0, s>>>(in, out, n);
  }
}

}  // namespace cyxwiz::cuda
