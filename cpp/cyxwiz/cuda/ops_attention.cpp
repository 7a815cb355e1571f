// The ApiImpl method of attention's masked softmax (kernels_attention.cu). The batched GEMM is in
// blas.cpp; the backward of the softmax is softmaxBackward (ops_loss.cpp).
#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/arguments.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

Status ApiImpl::maskedSoftmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols,
                                     bool causal) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  CX_TRY(nullArguments("maskedSoftmaxForward", dev, {{"x", x}, {"y", y}}));
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchMaskedSoftmax(s->compute, x, y, rows, cols, causal);
  return launchStatus("maskedSoftmaxKernel", dev);
}

}  // namespace cyxwiz::cuda
