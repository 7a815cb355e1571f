// float16 (IEEE 754 binary16) and bfloat16 <-> float32. The engine never computes in 16 bits: a
// reduction widens each element to float32, combines, and rounds back to nearest, ties to even
// (what numpy's astype(float16) and torch's .to(torch.bfloat16) do). Inf and NaN stay what they are.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cyxwiz/tensor/dtype.h"

namespace cyxwiz {

// Element types for Tensor::data<T>(): the bits only, no arithmetic.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::Float16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::BFloat16; };

namespace half_detail {
inline uint32_t bitsOf(float f) { uint32_t u; std::memcpy(&u, &f, sizeof u); return u; }
inline float floatOf(uint32_t u) { float f; std::memcpy(&f, &u, sizeof f); return f; }
}  // namespace half_detail

// The float16 conversions are those of the FP16 library (Maratyszcza), which c10::Half uses too:
// float32 arithmetic does the rebiasing and the rounding, without branches, so a loop over them
// vectorises. They need IEEE float32 arithmetic in its default rounding mode, without flushing
// subnormals to zero (no -ffast-math).

// Exact: every float16 is a float32.
inline float halfToFloat(uint16_t h) {
  using namespace half_detail;
  const uint32_t w = static_cast<uint32_t>(h) << 16, sign = w & 0x80000000u, twoW = w + w;  // twoW: no sign
  // Normal, Inf, NaN: exponent + 224 puts 31 at 255 (Inf/NaN stay so), then * 2^-112 rebiases 15 -> 127.
  const float normal = floatOf((twoW >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal, zero: 0.5 + mant * 2^-24 has mant as its low bits; subtracting 0.5 leaves mant * 2^-24.
  const float subnormal = floatOf((twoW >> 17) | (126u << 23)) - 0.5f;
  const uint32_t isSubnormal = 0u - static_cast<uint32_t>(twoW < (1u << 27));  // all ones or zero: a mask, not a branch
  return floatOf(sign | (bitsOf(subnormal) & isSubnormal) | (bitsOf(normal) & ~isSubnormal));
}

// Round to nearest, ties to even; beyond 65520 Inf; NaN stays NaN (quiet, sign kept).
inline uint16_t floatToHalf(float f) {
  using namespace half_detail;
  const uint32_t w = bitsOf(f), shl1W = w + w, sign = w & 0x80000000u;
  // * 2^112 sends what float16 cannot hold to Inf; * 2^-110 leaves 4|f| otherwise.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  // Adding a power of two 2^13 times |f|'s (at least float16's smallest normal's) makes float32's
  // own round-to-nearest-even drop exactly the bits float16 has no room for, subnormals included.
  uint32_t bias = shl1W & 0xFF000000u;
  bias = std::max(bias, 0x71000000u);
  base = floatOf((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bitsOf(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  const uint32_t isNan = 0u - static_cast<uint32_t>(shl1W > 0xFF000000u);
  return static_cast<uint16_t>((sign >> 16) | (0x7E00u & isNan) | (nonsign & ~isNan));
}

// Exact: bfloat16 is the top half of a float32.
inline float bfloat16ToFloat(uint16_t b) { return half_detail::floatOf(static_cast<uint32_t>(b) << 16); }

// Round to nearest, ties to even; NaN stays NaN (quiet, sign kept).
inline uint16_t floatToBFloat16(float f) {
  const uint32_t x = half_detail::bitsOf(f);
  // Adding 0x7fff (+1 when the kept part is odd) carries exactly when rounding up is due; the
  // largest finite floats carry into Inf, as they should.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t isNan = 0u - static_cast<uint32_t>((x & 0x7fffffffu) > 0x7f800000u);
  return static_cast<uint16_t>((((x >> 16) | 0x40u) & isNan) | (rounded & ~isNan));
}

}  // namespace cyxwiz
