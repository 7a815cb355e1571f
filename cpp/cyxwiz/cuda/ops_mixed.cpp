// The ApiImpl methods of mixed precision's kernels (kernels_mixed.cu, and the 16-bit column sums of
// kernels_elementwise.cu): argument checks, the device's compute stream, the launch and its status.
// The 16-bit GEMMs are in blas_lt.cpp.
#include <string>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

Status checkSixteenBit(const char* who, int dev, ElemType t) {
  if (t == ElemType::Float16 || t == ElemType::BFloat16) return {};
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": ElemType " + std::to_string(int(t)) +
         " is not a 16-bit float type (Float16 or BFloat16)";
}

}  // namespace

Status ApiImpl::reluBackward16(int dev, ElemType type, const void* x, const float* g, float* dx, int64_t n) noexcept {
  CX_TRY(checkSixteenBit("reluBackward16", dev, type));
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchReluBackward16(s->compute, type, static_cast<const uint16_t*>(x), g, dx, n);
  return launchStatus("reluBackward16Kernel", dev);
}

Status ApiImpl::addColumnSums16(int dev, ElemType type, const void* g, float* out, int64_t rows,
                                int64_t cols) noexcept {
  CX_TRY(checkSixteenBit("addColumnSums16", dev, type));
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchAddColumnSums16(s->compute, type, static_cast<const uint16_t*>(g), out, rows, cols);
  return launchStatus("addColumnSumsKernel", dev);
}

Status ApiImpl::scaleFloats(int dev, const float* in, float* out, int64_t n, float factor, float* nonFinite) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchScaleFloats(s->compute, in, out, n, factor, nonFinite);
  return launchStatus("scaleFloatsKernel", dev);
}

}  // namespace cyxwiz::cuda
