// The ApiImpl methods of the element-wise kernels (kernels_elementwise.cu, kernels_convert.cu):
// argument checks, the device's compute stream, the launch (launch.h) and its status.
#include <string>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

Status unknownActivation(const char* who, int dev, Activation f) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": unknown Activation " + std::to_string(int(f));
}

bool isSixteenBitFloat(ElemType t) { return t == ElemType::Float16 || t == ElemType::BFloat16; }

}  // namespace

Status ApiImpl::fill(int dev, float* dst, int64_t n, float value) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchFill(s->compute, dst, n, value);
  return launchStatus("fillKernel", dev);
}

Status ApiImpl::broadcastRows(int dev, const float* row, float* out, int64_t rows, int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchBroadcastRows(s->compute, row, out, rows, cols);
  return launchStatus("broadcastRowsKernel", dev);
}

Status ApiImpl::addColumnSums(int dev, const float* g, float* out, int64_t rows, int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchAddColumnSums(s->compute, g, out, rows, cols);
  return launchStatus("addColumnSumsKernel", dev);
}

Status ApiImpl::multiply(int dev, const float* a, const float* b, float* out, int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchMultiply(s->compute, a, b, out, n);
  return launchStatus("multiplyKernel", dev);
}

Status ApiImpl::add(int dev, const float* a, const float* b, float* out, int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchAdd(s->compute, a, b, out, n);
  return launchStatus("addKernel", dev);
}

Status ApiImpl::activationForward(int dev, Activation f, const float* x, float* y, int64_t n, float param) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (!knownActivation(f)) return unknownActivation("activationForward", dev, f);
  launchActivationForward(s->compute, f, x, y, n, param);
  return launchStatus("activationForwardKernel", dev);
}

Status ApiImpl::activationBackward(int dev, Activation f, const float* x, const float* g, float* dx, int64_t n,
                                   float param) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (!knownActivation(f)) return unknownActivation("activationBackward", dev, f);
  launchActivationBackward(s->compute, f, x, g, dx, n, param);
  return launchStatus("activationBackwardKernel", dev);
}

Status ApiImpl::dropoutForward(int dev, const float* x, float* y, float* mask, int64_t n, float keep,
                               uint64_t seed, const uint64_t* seedOnDevice) noexcept {
  if (!(keep > 0.0f && keep <= 1.0f)) {
    return "dropoutForward on cuda:" + std::to_string(dev) + ": keep probability " + std::to_string(keep) +
           " is outside (0, 1]";
  }
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchDropout(s->compute, x, y, mask, n, keep, 1.0f / keep, seed, seedOnDevice);
  return launchStatus("dropoutKernel", dev);
}

Status ApiImpl::convertFloats(int dev, const void* in, ElemType inType, void* out, ElemType outType, int64_t n,
                              float scale) noexcept {
  const bool narrow = inType == ElemType::Float32 && isSixteenBitFloat(outType);
  const bool widen = isSixteenBitFloat(inType) && outType == ElemType::Float32;
  if (!narrow && !widen) {
    return "convertFloats on cuda:" + std::to_string(dev) + ": converts float32 to float16/bfloat16 or back, not "
           "ElemType " + std::to_string(int(inType)) + " to " + std::to_string(int(outType));
  }
  if (widen && scale != 1.0f) {
    return "convertFloats on cuda:" + std::to_string(dev) + ": widening is exact and takes scale 1, got " +
           std::to_string(scale);
  }
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (narrow) {
    launchNarrowFloats(s->compute, static_cast<const float*>(in), static_cast<uint16_t*>(out), n, outType, scale);
    return launchStatus("narrowKernel", dev);
  }
  launchWidenFloats(s->compute, static_cast<const uint16_t*>(in), static_cast<float*>(out), n, inType);
  return launchStatus("widenKernel", dev);
}

}  // namespace cyxwiz::cuda
