// The arithmetic of a reduction, apart from any transport: acc[i] = acc[i] (op) in[i].
#pragma once

#include <cstddef>

#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm {

// AVG reduces as SUM; finishAverage divides once at the end, so every rank divides the same sum.
void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);
void finishAverage(void* data, size_t count, DType dtype, int worldSize);
// Throws InvalidArgument when `op` is meaningless for `dtype` (AVG of integers).
void checkReduceOp(ReduceOp op, DType dtype);

}  // namespace cyxwiz::comm
