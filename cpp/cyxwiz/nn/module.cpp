#include "cyxwiz/nn/module.h"

#include <cstring>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::nn {

void Module::zeroGrad() {
  for (Parameter* p : parameters()) {
    if (!p->grad.nbytes()) continue;
    if (p->grad.isCuda()) {
      CYX_CUDA(memsetZero(p->grad.device().index, p->grad.rawData(), p->grad.nbytes()));
    } else {
      std::memset(p->grad.rawData(), 0, p->grad.nbytes());
    }
  }
}

void Module::to(const Device& device) {
  for (Parameter* p : parameters()) {
    p->value = p->value.to(device);
    if (p->grad.defined()) p->grad = p->grad.to(device);
  }
  clearCache();
}

int64_t Module::numParameters() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

void Module::requireForward(const Tensor& cached) const {
  if (!cached.defined()) {
    throw InvalidArgument(typeName() + ".backward called before forward; run forward on the batch first");
  }
}

void Module::checkBackward(const Tensor& cached, const Tensor& gradOutput, const Shape& expected) const {
  requireForward(cached);
  if (gradOutput.dtype() != DType::Float32 || gradOutput.shape() != expected) {
    throw InvalidArgument(makeString(typeName(), ".backward: expected a float32 gradient of shape ", shapeString(expected),
                                     " (the shape forward returned), got ", dtypeName(gradOutput.dtype()), " ",
                                     shapeString(gradOutput.shape())));
  }
}

void requireMatrix(const Tensor& t, const std::string& who, int64_t features) {
  if (t.dim() != 2 || (features >= 0 && t.size(1) != features)) {
    std::string want = features >= 0 ? makeString("(batch, ", features, ")") : std::string("(batch, features)");
    throw InvalidArgument(makeString(who, ": expected input of shape ", want, ", got ", shapeString(t.shape())));
  }
  if (t.dtype() != DType::Float32) {
    throw TypeMismatch(makeString(who, ": expected float32 input, got ", dtypeName(t.dtype())));
  }
}

}  // namespace cyxwiz::nn
