#include "cyxwiz/tensor/convert16.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/tensor/half.h"

namespace cyxwiz {

namespace {

template <uint16_t (*Narrow)(float)>
void narrowLoop(const float* __restrict in, uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Narrow(in[i]);
}

template <float (*Widen)(uint16_t)>
void widenLoop(const uint16_t* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Widen(in[i]);
}

// No __restrict: in-place rounding is allowed (each element is read before it is written).
template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void roundLoop(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Widen(Narrow(in[i]));
}

void check16(DType dtype) {
  CYX_CHECK(dtype == DType::BFloat16 || dtype == DType::Float16, "16-bit conversion: ", dtypeName(dtype),
            " is not bfloat16 or float16");
}

}  // namespace

void narrowFloats(const float* in, uint16_t* out, int64_t n, DType dtype) {
  check16(dtype);
  if (dtype == DType::BFloat16) {
    narrowLoop<floatToBFloat16>(in, out, n);
  } else {
    narrowLoop<floatToHalf>(in, out, n);
  }
}

void widenFloats(const uint16_t* in, float* out, int64_t n, DType dtype) {
  check16(dtype);
  if (dtype == DType::BFloat16) {
    widenLoop<bfloat16ToFloat>(in, out, n);
  } else {
    widenLoop<halfToFloat>(in, out, n);
  }
}

void roundFloats(const float* in, float* out, int64_t n, DType dtype) {
  check16(dtype);
  if (dtype == DType::BFloat16) {
    roundLoop<floatToBFloat16, bfloat16ToFloat>(in, out, n);
  } else {
    roundLoop<floatToHalf, halfToFloat>(in, out, n);
  }
}

void roundBlock(const float* in, int64_t ld, float* out, int64_t rows, int64_t cols, DType dtype) {
  if (ld == cols) return roundFloats(in, out, rows * cols, dtype);
  for (int64_t r = 0; r < rows; ++r) roundFloats(in + r * ld, out + r * cols, cols, dtype);
}

}  // namespace cyxwiz
