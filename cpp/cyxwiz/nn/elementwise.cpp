#include "cyxwiz/nn/elementwise.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz::nn {

void requireFloatTensor(const Tensor& t, const std::string& who) {
  if (t.dtype() != DType::Float32) throw TypeMismatch(makeString(who, ": expected float32 input, got ", dtypeName(t.dtype())));
  CYX_CHECK(t.dim() >= 1, who, ": expected an input with at least one dimension, got a scalar");
}

}  // namespace cyxwiz::nn
