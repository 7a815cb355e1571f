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
  for (Buffer* b : buffers()) b->value = b->value.to(device);
  clearCache();
}

std::vector<std::pair<std::string, Parameter*>> Module::namedParameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (Parameter* p : parameters()) out.emplace_back(p->name, p);
  return out;
}

std::vector<std::pair<std::string, Buffer*>> Module::namedBuffers() {
  std::vector<std::pair<std::string, Buffer*>> out;
  for (Buffer* b : buffers()) out.emplace_back(b->name, b);
  return out;
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

void requireInput(const Tensor& t, const std::string& who, int64_t rank, const char* layout) {
  if (t.dtype() != DType::Float32) throw TypeMismatch(makeString(who, ": expected float32 input, got ", dtypeName(t.dtype())));
  if (t.dim() != rank) {
    throw InvalidArgument(makeString(who, ": expected a ", rank, "-D input ", layout, ", got ", shapeString(t.shape())));
  }
}

std::string describeShape(const Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += shape[i] >= 0 ? std::to_string(shape[i]) : (i == 0 ? "N" : "?");
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

}  // namespace cyxwiz::nn
