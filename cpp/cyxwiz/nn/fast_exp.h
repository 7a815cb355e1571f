// e^x for x <= 0 without libm, for the loops that call it per element (GELU, the softmaxes), and the
// softmaxes' row maximum.
#pragma once

#include <cstdint>
#include <cstring>

namespace cyxwiz::nn {

// x = n ln2 + r, |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^n from the
// exponent bits. Branch-free, so the loops over it vectorise (with -fno-trapping-math, set for the files
// that use it in cpp/CMakeLists.txt: GCC will not if-convert float compares that could trap); libm's expf
// per element kept GELU at ~8 ms of a 19 ms Transformer block (d 128, 1024 tokens). A small positive x
// (a rounding above 0) is fine too: n = 0, and the polynomial holds to |r| <= ln2/2.
inline float expNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // e^-87 ~ 1.6e-38, still a normal float
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 x 2^23), no libm call
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 in two parts (Cody-Waite)
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// The largest of x[0, n), n > 0, over 16 lanes (a vector's select per lane, where one running max is
// a chain the compiler will not vectorise without -ffast-math); for the softmaxes' shift, inlined into
// their cloned loops.
inline float maxOfRow(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float mx = x[0];
  for (int64_t j = 0; j < kLanes; ++j) mx = lanes[j] > mx ? lanes[j] : mx;
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

}  // namespace cyxwiz::nn
