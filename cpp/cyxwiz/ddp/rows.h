// Row selection on (N, ...) tensors: batches picked by sampler indices, and splits of a dataset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::ddp {

// A new tensor holding rows `indices` of `t`, in that order (any dtype, any rank >= 1).
Tensor gatherRows(const Tensor& t, const std::vector<int64_t>& indices);
// Rows [begin, end) of `t` as a view (no copy).
Tensor rowRange(const Tensor& t, int64_t begin, int64_t end);
// Throws InvalidArgument unless X is a float32 array of 2 or more dimensions (samples first) and y has as many rows; `who` names the caller.
void checkDataset(const Tensor& X, const Tensor& y, const std::string& who);

}  // namespace cyxwiz::ddp
