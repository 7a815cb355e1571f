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
// The 16-bit gradient exchange computed on float32 buffers (ddp/wire.h, Collectives::allReduceRounded),
// element by element as the exchange of 16-bit copies computes it: r(x) rounds x to `wire` (bfloat16 or
// float16, nearest, ties to even) and widens it back, exactly. acc = r(in * scale); acc = r(acc + r(in *
// scale)), acc already holding `wire` values; d = r(d / worldSize) (finishAverage's AVG, to the bit).
void roundScaled(float* acc, const float* in, size_t count, DType wire, float scale);
void sumRounded(float* acc, const float* in, size_t count, DType wire, float scale);
void finishAverageRounded(float* d, size_t count, DType wire, int worldSize);
// d = the SUM or AVG of n float32 sources (2 <= n <= kMaxSources) in one pass: the bits of copying
// sources[0], reduceInto for each next one in rank order and finishAverage. d overlaps no source. False
// (nothing done) for other dtypes, ops and counts: the caller takes those passes itself.
constexpr size_t kMaxSources = 8;
bool reduceSources(void* d, const void* const* sources, size_t n, size_t count, DType dtype, ReduceOp op);
// Two ranks' contributions a and b in one pass into d (which may be a or b): false, doing nothing,
// where no such pass exists (float16: the three calls above).
bool reduceTwoRounded(float* d, const float* a, const float* b, size_t count, DType wire, float scale, bool average);

// Throws InvalidArgument when `op` is meaningless for `dtype` (AVG of bool); `what` names the collective.
void checkReduceOp(ReduceOp op, DType dtype, const char* what);

}  // namespace cyxwiz::comm
