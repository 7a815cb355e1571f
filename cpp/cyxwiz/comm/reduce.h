// The arithmetic of a reduction, apart from any transport: acc[i] = acc[i] (op) in[i].
#pragma once

#include <cstddef>

#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm {

// AVG reduces as SUM; finishAverage divides once at the end, so every rank divides the same sum
// (integers: truncated toward zero, as torch and NCCL do).
// Integers wrap around on overflow (as numpy's do). Bool: SUM and MAX are "any", PRODUCT and MIN
// "all" (as torch and Gloo). float16/bfloat16: each element is combined in float32 and rounded back
// (nearest, ties to even), so a ring that reduces hop by hop rounds at every hop, as Gloo does: with
// N ranks each of the N-1 combining steps rounds to 16 bits, not only the final result.
void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);
void finishAverage(void* data, size_t count, DType dtype, int worldSize);
// Throws InvalidArgument when `op` is meaningless for `dtype` (AVG of bool); `what` names the collective.
void checkReduceOp(ReduceOp op, DType dtype, const char* what);

}  // namespace cyxwiz::comm
