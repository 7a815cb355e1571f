// Shared shape/dtype checks for the element-wise activations.
#pragma once

#include <string>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

// Requires a float32 tensor with at least one dimension.
void requireFloatTensor(const Tensor& t, const std::string& who);

}  // namespace cyxwiz::nn
