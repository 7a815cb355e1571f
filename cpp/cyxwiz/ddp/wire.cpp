#include "cyxwiz/ddp/wire.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/tensor/convert16.h"

namespace cyxwiz::ddp {

namespace {

void checkPair(const Tensor& grads, const Tensor& wire, const char* what) {
  CYX_CHECK(grads.dtype() == DType::Float32 && (wire.dtype() == DType::BFloat16 || wire.dtype() == DType::Float16) &&
                grads.numel() == wire.numel() && grads.device() == wire.device(),
            what, ": expected float32 gradients and a 16-bit buffer of the same size on the same device, got ",
            dtypeName(grads.dtype()), " on ", grads.device().str(), " and ", dtypeName(wire.dtype()), " on ",
            wire.device().str());
}

// The codes are DType's (cuda/api.h).
cuda::ElemType elemType(DType d) { return static_cast<cuda::ElemType>(static_cast<int>(d)); }

}  // namespace

DType parseGradientDtype(const std::string& name) {
  if (name == "float32") return DType::Float32;
  if (name == "bfloat16") return DType::BFloat16;
  if (name == "float16") return DType::Float16;
  throw InvalidArgument(makeString("DDPConfig.gradient_dtype='", name, "': the dtype gradients travel in between ranks "
                                   "is one of 'float32' (default), 'bfloat16' or 'float16'"));
}

void narrowGradients(const Tensor& grads, const Tensor& wire, float scale) {
  checkPair(grads, wire, "narrowGradients");
  if (grads.isCuda()) {  // a kernel on the device's compute stream, after the backward that wrote grads
    CYX_CUDA(convertFloats(grads.device().index, grads.rawData(), cuda::ElemType::Float32, wire.rawData(),
                           elemType(wire.dtype()), grads.numel(), scale));
    return;
  }
  auto* out = static_cast<uint16_t*>(wire.rawData());
  if (scale == 1.0f) {
    narrowFloats(grads.data<float>(), out, grads.numel(), wire.dtype());
  } else {
    narrowScaledFloats(grads.data<float>(), out, grads.numel(), scale, wire.dtype());
  }
}

void widenGradients(const Tensor& wire, const Tensor& grads, int64_t first, int64_t last) {
  checkPair(grads, wire, "widenGradients");
  CYX_CHECK(0 <= first && first <= last && last <= grads.numel(), "widenGradients: range out of bounds");
  if (grads.isCuda()) {  // on the compute stream: after the collective once its Work was waited for
    CYX_CUDA(convertFloats(grads.device().index, static_cast<const uint16_t*>(wire.rawData()) + first,
                           elemType(wire.dtype()), grads.deviceData<float>() + first, cuda::ElemType::Float32,
                           last - first, 1.0f));
    return;
  }
  widenFloats(static_cast<const uint16_t*>(wire.rawData()) + first, grads.data<float>() + first, last - first,
              wire.dtype());
}

}  // namespace cyxwiz::ddp
