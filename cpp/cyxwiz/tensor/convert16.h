// Host loops between float32 and the 16-bit floats (bfloat16, float16) for the mixed-precision layers
// (nn/autocast.h) and the 16-bit gradient exchange (ddp/wire.h): branch-free conversions from half.h in plain loops, which the compiler vectorises,
// cloned per instruction set (AVX-512, AVX2, baseline). Every function takes the 16-bit type as a DType (BFloat16 or Float16).
#pragma once

#include <cstdint>

#include "cyxwiz/tensor/dtype.h"

namespace cyxwiz {

// out[i] = the 16-bit value nearest in[i] (ties to even).
void narrowFloats(const float* in, uint16_t* out, int64_t n, DType dtype);
// out[i] = the 16-bit value nearest in[i] * scale (float16 gradients pre-divided by the world size, ddp/wire.h).
void narrowScaledFloats(const float* in, uint16_t* out, int64_t n, float scale, DType dtype);
// out[i] = in[i] as float32 (exact).
void widenFloats(const uint16_t* in, float* out, int64_t n, DType dtype);
// out[i] = in[i] rounded to the 16-bit type and back: a float32 that a 16-bit value holds exactly.
// `in` and `out` may be the same array.
void roundFloats(const float* in, float* out, int64_t n, DType dtype);
// The same for a (rows, cols) block whose rows lie `ld` floats apart in `in`; `out` is dense.
void roundBlock(const float* in, int64_t ld, float* out, int64_t rows, int64_t cols, DType dtype);

}  // namespace cyxwiz
