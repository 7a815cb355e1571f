#include "cyxwiz/tensor/convert16.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/cpu.h"
#include "cyxwiz/tensor/half.h"

namespace cyxwiz {

namespace {

// One loop per conversion, each cloned per instruction set (platform/cpu.h): the branch-free
// conversions of half.h vectorise to 8 or 16 lanes where the CPU has them, 4 otherwise.
#define CYXWIZ_LOOP(name, InT, OutT, expr)                                             \
  CYXWIZ_CPU_CLONES void name(const InT* __restrict in, OutT* __restrict out, int64_t n) { \
    for (int64_t i = 0; i < n; ++i) out[i] = expr;                                    \
  }
CYXWIZ_LOOP(narrowBf16, float, uint16_t, floatToBFloat16(in[i]))
CYXWIZ_LOOP(narrowHalf, float, uint16_t, floatToHalf(in[i]))
CYXWIZ_LOOP(widenBf16, uint16_t, float, bfloat16ToFloat(in[i]))
CYXWIZ_LOOP(widenHalf, uint16_t, float, halfToFloat(in[i]))
CYXWIZ_LOOP(roundBf16, float, float, bfloat16ToFloat(floatToBFloat16(in[i])))
CYXWIZ_LOOP(roundHalf, float, float, halfToFloat(floatToHalf(in[i])))
#undef CYXWIZ_LOOP

// In place (autocast rounds the gradient a layer receives in place): one pointer, so the loop needs no
// __restrict pair and no temporary block copied back.
CYXWIZ_CPU_CLONES void roundBf16InPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bfloat16ToFloat(floatToBFloat16(x[i]));
}
CYXWIZ_CPU_CLONES void roundHalfInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = halfToFloat(floatToHalf(x[i]));
}

CYXWIZ_CPU_CLONES void narrowScaledBf16(const float* __restrict in, uint16_t* __restrict out, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) out[i] = floatToBFloat16(in[i] * s);
}
CYXWIZ_CPU_CLONES void narrowScaledHalf(const float* __restrict in, uint16_t* __restrict out, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) out[i] = floatToHalf(in[i] * s);
}

void check16(DType dtype) {
  CYX_CHECK(dtype == DType::BFloat16 || dtype == DType::Float16, "16-bit conversion: ", dtypeName(dtype),
            " is not bfloat16 or float16");
}

}  // namespace

void narrowFloats(const float* in, uint16_t* out, int64_t n, DType dtype) {
  check16(dtype);
  if (dtype == DType::BFloat16) {
    narrowBf16(in, out, n);
  } else {
    narrowHalf(in, out, n);
  }
}

void narrowScaledFloats(const float* in, uint16_t* out, int64_t n, float scale, DType dtype) {
  check16(dtype);
  if (dtype == DType::BFloat16) {
    narrowScaledBf16(in, out, n, scale);
  } else {
    narrowScaledHalf(in, out, n, scale);
  }
}

void widenFloats(const uint16_t* in, float* out, int64_t n, DType dtype) {
  check16(dtype);
  if (dtype == DType::BFloat16) {
    widenBf16(in, out, n);
  } else {
    widenHalf(in, out, n);
  }
}

void roundFloats(const float* in, float* out, int64_t n, DType dtype) {
  check16(dtype);
  if (in == out) {
    if (dtype == DType::BFloat16) {
      roundBf16InPlace(out, n);
    } else {
      roundHalfInPlace(out, n);
    }
    return;
  }
  if (dtype == DType::BFloat16) {
    roundBf16(in, out, n);
  } else {
    roundHalf(in, out, n);
  }
}

void roundBlock(const float* in, int64_t ld, float* out, int64_t rows, int64_t cols, DType dtype) {
  if (ld == cols) return roundFloats(in, out, rows * cols, dtype);
  for (int64_t r = 0; r < rows; ++r) roundFloats(in + r * ld, out + r * cols, cols, dtype);
}

}  // namespace cyxwiz
