// Mixed precision's kernels: ReLU's backward from a 16-bit copy (autocast) and the GradScaler's
// scale-and-check. The math is kernel_math.h's; the ApiImpl methods are in ops_mixed.cpp.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

template <ElemType T>
__global__ void reluBackward16Kernel(const uint16_t* x, const float* g, float* dx, int64_t n) {
  for (int64_t i = globalIndex(); i < n; i += globalStride()) reluBackward16Element<T>(x, g, dx, i);
}

// Every thread that saw an Inf/NaN writes the same 1: no atomics, and the flag is written only then,
// so one zeroed flag collects the verdict of several launches (every gradient of a model).
__global__ void scaleFloatsKernel(const float* in, float* out, int64_t n, float factor, float* nonFinite) {
  bool bad = false;
  for (int64_t i = globalIndex(); i < n; i += globalStride()) bad |= scaleElement(in, out, i, factor);
  if (bad && nonFinite) *nonFinite = 1.0f;
}

}  // namespace

void launchReluBackward16(cudaStream_t s, ElemType type, const uint16_t* x, const float* g, float* dx, int64_t n) {
  if (type == ElemType::BFloat16) {
    reluBackward16Kernel<ElemType::BFloat16><<<gridFor(n), kThreads, 0, s>>>(x, g, dx, n);
  } else {
    reluBackward16Kernel<ElemType::Float16><<<gridFor(n), kThreads, 0, s>>>(x, g, dx, n);
  }
}

void launchScaleFloats(cudaStream_t s, const float* in, float* out, int64_t n, float factor, float* nonFinite) {
  scaleFloatsKernel<<<gridFor(n), kThreads, 0, s>>>(in, out, n, factor, nonFinite);
}

}  // namespace cyxwiz::cuda
