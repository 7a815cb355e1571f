#include "cyxwiz/nn/autocast.h"

#include <memory>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/ops16.h"
#include "cyxwiz/tensor/convert16.h"

namespace cyxwiz::nn {

namespace {

thread_local AutocastState tState;

// The one 16-bit copy on offer (narrowActivation): which float32 tensor it copies, and the copy.
struct Offer {
  std::weak_ptr<Storage> storage;  // never keeps the float32 activation alive
  const void* data = nullptr;
  Shape shape;
  Tensor copy;
};
thread_local Offer tOffer;

bool offeredFor(const Tensor& x, DType dtype) {
  if (!tOffer.copy.defined()) return false;
  const std::shared_ptr<Storage> alive = tOffer.storage.lock();
  if (!alive || alive != x.storage() || tOffer.data != x.rawData() || tOffer.shape != x.shape() ||
      tOffer.copy.dtype() != dtype) {
    return false;
  }
  return true;
}

}  // namespace

AutocastState autocastState() { return tState; }

std::optional<DType> autocastDtype() {
  if (!tState.enabled) return std::nullopt;
  return tState.dtype;
}

DType parseAutocastDtype(const std::string& name, const std::string& who) {
  if (name == "bfloat16" || name == "bf16") return DType::BFloat16;
  if (name == "float16" || name == "fp16") return DType::Float16;
  throw InvalidArgument(makeString(who, ": dtype '", name, "' is not a 16-bit float type; use 'bfloat16' (\"bf16\") "
                                   "or 'float16' (\"fp16\", with a GradScaler)"));
}

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : AutocastGuard(AutocastState{enabled, dtype}) {}

AutocastGuard::AutocastGuard(const AutocastState& state) : previous_(tState) {
  CYX_CHECK(state.dtype == DType::BFloat16 || state.dtype == DType::Float16, "autocast: dtype ",
            dtypeName(state.dtype), " is not a 16-bit float type; use bfloat16 or float16");
  tState = state;
}

AutocastGuard::~AutocastGuard() {
  tState = previous_;
  if (!tState.enabled) tOffer = Offer{};  // leaving autocast: drop the copy on offer
}

Tensor narrowActivation(const Tensor& x, DType dtype, bool offer) {
  if (offeredFor(x, dtype)) {
    Tensor copy = std::move(tOffer.copy);
    tOffer = Offer{};
    return copy;
  }
  Tensor copy;
  if (x.isCuda()) {
    copy = ops::narrowOnDevice(x, dtype);  // a cast kernel on the device's compute stream
  } else {
    copy = Tensor::empty(x.shape(), dtype);
    narrowFloats(x.data<float>(), static_cast<uint16_t*>(copy.rawData()), x.numel(), dtype);
  }
  if (offer) {
    tOffer = Offer{x.storage(), x.rawData(), x.shape(), copy};
  } else {
    tOffer = Offer{};
  }
  return copy;
}

}  // namespace cyxwiz::nn
