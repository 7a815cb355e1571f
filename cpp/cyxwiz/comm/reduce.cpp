#include "cyxwiz/comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/platform/cpu.h"
#include "cyxwiz/tensor/half.h"

namespace cyxwiz::comm {

namespace {

// How an element is read for arithmetic and written back. float16 and bfloat16 are combined in
// float32 and rounded back each time (so a ring rounds at every hop, as Gloo does).
template <typename T>
struct Plain {
  using Stored = T;
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
struct WidenedHalf {
  using Stored = uint16_t;
  static float load(uint16_t x) { return halfToFloat(x); }
  static uint16_t store(float x) { return floatToHalf(x); }
};
struct WidenedBFloat16 {
  using Stored = uint16_t;
  static float load(uint16_t x) { return bfloat16ToFloat(x); }
  static uint16_t store(float x) { return floatToBFloat16(x); }
};

template <typename E, typename F>
void apply(void* acc, const void* in, size_t n, F f) {
  using S = typename E::Stored;
  S* __restrict a = static_cast<S*>(acc);
  const S* __restrict b = static_cast<const S*>(in);
  for (size_t i = 0; i < n; ++i) a[i] = E::store(f(E::load(a[i]), E::load(b[i])));
}

// The same for 16-bit floats, a block at a time: widening, combining and rounding back each in a
// loop of its own lets the compiler vectorise all three (one fused loop it leaves scalar).
template <typename E, typename F>
void applyWidened(void* acc, const void* in, size_t n, F f) {
  constexpr size_t kBlock = 512;
  float x[kBlock], y[kBlock];
  uint16_t* __restrict a = static_cast<uint16_t*>(acc);
  const uint16_t* __restrict b = static_cast<const uint16_t*>(in);
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    for (size_t i = 0; i < m; ++i) x[i] = E::load(a[at + i]);
    for (size_t i = 0; i < m; ++i) y[i] = E::load(b[at + i]);
    for (size_t i = 0; i < m; ++i) x[i] = f(x[i], y[i]);
    for (size_t i = 0; i < m; ++i) a[at + i] = E::store(x[i]);
  }
}

template <typename E, typename F>
void applyFloating(void* acc, const void* in, size_t n, F f) {
  if constexpr (std::is_same_v<typename E::Stored, uint16_t>) {
    applyWidened<E>(acc, in, n, f);
  } else {
    apply<E>(acc, in, n, f);
  }
}

// The 16-bit sums the gradient exchange runs at every step (ddp/wire.h), cloned per instruction set
// (platform/cpu.h): on AVX-512 about 1.7x the baseline loops' speed (10M elements). bfloat16 widens
// by a shift, so its fused loop vectorises; float16's conversions vectorise only in separate loops.
CYXWIZ_CPU_CLONES void sumBFloat16(uint16_t* __restrict a, const uint16_t* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = floatToBFloat16(bfloat16ToFloat(a[i]) + bfloat16ToFloat(b[i]));
}
CYXWIZ_CPU_CLONES void sumHalf(uint16_t* __restrict a, const uint16_t* __restrict b, size_t n) {
  constexpr size_t kBlock = 512;
  float x[kBlock], y[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    for (size_t i = 0; i < m; ++i) x[i] = halfToFloat(a[at + i]);
    for (size_t i = 0; i < m; ++i) y[i] = halfToFloat(b[at + i]);
    for (size_t i = 0; i < m; ++i) x[i] = x[i] + y[i];
    for (size_t i = 0; i < m; ++i) a[at + i] = floatToHalf(x[i]);
  }
}

// bfloat16 AVG's last pass (the exchange's default dtype), cloned as its sum is.
CYXWIZ_CPU_CLONES void multiplyBFloat16(uint16_t* __restrict d, size_t n, float k) {
  for (size_t i = 0; i < n; ++i) d[i] = floatToBFloat16(bfloat16ToFloat(d[i]) * k);
}

// The rounded exchange on float32 buffers (reduce.h): the same roundings as narrowScaledFloats, sumBFloat16 /
// sumHalf and finishAverage on 16-bit copies, so the same bits. bfloat16 rounds by integer operations and
// its loops vectorise as they are; float16's conversions only in loops of their own.
// bfloat16ToFloat(floatToBFloat16(x)) to the bit (NaN: quiet, sign and top payload kept), in 32-bit
// integer operations and one compare: no narrowing to 16 bits and back, so a loop of several roundings
// vectorises without packing (2.3x faster in a fused two-source loop on AVX-512; checked equal on 1M random floats).
inline float roundBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quietNan = (x & 0xffff0000u) | 0x00400000u;
  const uint32_t r = f != f ? quietNan : rounded;  // one unordered compare: fewer ops than testing the bits
  float out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}
// Two ranks, the exchange's usual case, in one pass: d = r(r(r(a s) + r(b s)) k), k = 1 for a sum. d may
// be a or b (a rank's own part, in place): element by element, so no __restrict.
// bfloat16's scale is 1 (ddp.cpp): a loop without the two multiplications by it (x * 1 is x, a NaN
// quieted by either way). The rounding is what a 2-rank step on one host waits for: with both changes
// this loop took 24 instead of 34 ms over 20M elements on the 2-core Xeon (float32's sum: 14).
CYXWIZ_CPU_CLONES void twoRoundedBf16(float* d, const float* a, const float* b, size_t n, float s, float k) {
  if (s == 1.0f) {
    for (size_t i = 0; i < n; ++i) d[i] = roundBf16(roundBf16(roundBf16(a[i]) + roundBf16(b[i])) * k);
    return;
  }
  for (size_t i = 0; i < n; ++i) d[i] = roundBf16(roundBf16(roundBf16(a[i] * s) + roundBf16(b[i] * s)) * k);
}
CYXWIZ_CPU_CLONES void roundScaledBf16(float* __restrict a, const float* __restrict b, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) a[i] = roundBf16(b[i] * s);
}
CYXWIZ_CPU_CLONES void sumRoundedBf16(float* __restrict a, const float* __restrict b, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) a[i] = roundBf16(a[i] + roundBf16(b[i] * s));
}
CYXWIZ_CPU_CLONES void scaleRoundedBf16(float* __restrict d, size_t n, float k) {
  for (size_t i = 0; i < n; ++i) d[i] = roundBf16(d[i] * k);
}
template <typename F>
void roundedHalfBlocks(float* a, size_t n, F value) {  // value(i) may read a[i]: no __restrict
  constexpr size_t kBlock = 512;
  uint16_t h[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    for (size_t i = 0; i < m; ++i) h[i] = floatToHalf(value(at + i));
    for (size_t i = 0; i < m; ++i) a[at + i] = halfToFloat(h[i]);
  }
}

// float32, every collective's usual dtype, cloned per instruction set like the 16-bit loops.
CYXWIZ_CPU_CLONES void sumFloats(float* __restrict a, const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
}
CYXWIZ_CPU_CLONES void multiplyFloats(float* __restrict d, size_t n, float k) {
  for (size_t i = 0; i < n; ++i) d[i] = d[i] * k;
}
CYXWIZ_CPU_CLONES void divideFloats(float* __restrict d, size_t n, float k) {
  for (size_t i = 0; i < n; ++i) d[i] = d[i] / k;
}

template <typename E>
void sum(void* acc, const void* in, size_t n) {
  if constexpr (std::is_same_v<E, Plain<float>>) {
    sumFloats(static_cast<float*>(acc), static_cast<const float*>(in), n);
  } else if constexpr (std::is_same_v<E, WidenedBFloat16>) {
    sumBFloat16(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n);
  } else if constexpr (std::is_same_v<E, WidenedHalf>) {
    sumHalf(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), n);
  } else {
    apply<E>(acc, in, n, [](auto x, auto y) { return x + y; });
  }
}

template <typename E>
void reduceFloating(void* acc, const void* in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: sum<E>(acc, in, n); return;
    case ReduceOp::Product: applyFloating<E>(acc, in, n, [](auto x, auto y) { return x * y; }); return;
    // NaN wins, as in numpy.maximum/minimum and torch: a NaN gradient must not vanish in a MAX.
    case ReduceOp::Max: applyFloating<E>(acc, in, n, [](auto x, auto y) { return (x != x || x > y) ? x : (y != y ? y : std::max(x, y)); }); return;
    case ReduceOp::Min: applyFloating<E>(acc, in, n, [](auto x, auto y) { return (x != x || x < y) ? x : (y != y ? y : std::min(x, y)); }); return;
  }
}

// Integers wrap around on overflow, as numpy's and torch's do; the arithmetic runs in an unsigned
// type at least as wide as int, where wrapping is defined (uint16 * uint16 in int would overflow).
template <typename T>
void reduceInteger(void* acc, const void* in, size_t n, ReduceOp op) {
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: apply<Plain<T>>(acc, in, n, [](T x, T y) { return static_cast<T>(U(x) + U(y)); }); return;
    case ReduceOp::Product: apply<Plain<T>>(acc, in, n, [](T x, T y) { return static_cast<T>(U(x) * U(y)); }); return;
    case ReduceOp::Max: apply<Plain<T>>(acc, in, n, [](T x, T y) { return std::max(x, y); }); return;
    case ReduceOp::Min: apply<Plain<T>>(acc, in, n, [](T x, T y) { return std::min(x, y); }); return;
  }
}

// Bool as torch and Gloo reduce it: SUM and MAX are "any", PRODUCT and MIN are "all".
void reduceBool(void* acc, const void* in, size_t n, ReduceOp op) {
  const bool any = op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Max;
  if (any) {
    apply<Plain<uint8_t>>(acc, in, n, [](uint8_t x, uint8_t y) { return static_cast<uint8_t>((x | y) != 0); });
  } else {
    apply<Plain<uint8_t>>(acc, in, n, [](uint8_t x, uint8_t y) { return static_cast<uint8_t>(x != 0 && y != 0); });
  }
}

template <typename E>
void divideBy(void* data, size_t count, int worldSize) {
  using S = typename E::Stored;
  using T = decltype(E::load(S{}));
  S* d = static_cast<S*>(data);
  const auto n = static_cast<T>(worldSize);
  if ((worldSize & (worldSize - 1)) == 0) {
    // By a power of two, x * (1/n) is x / n to the bit, and a multiply costs a fraction of a divide
    // (the divide was 1.5% of the CPU samples of a profiled 20M-MLP DDP run at 2 ranks, ~2 ms a step).
    const T inverse = T(1) / n;
    if constexpr (std::is_same_v<E, WidenedBFloat16>) {
      multiplyBFloat16(d, count, inverse);
    } else if constexpr (std::is_same_v<E, Plain<float>>) {
      multiplyFloats(d, count, inverse);
    } else {
      for (size_t i = 0; i < count; ++i) d[i] = E::store(E::load(d[i]) * inverse);
    }
    return;
  }
  if constexpr (std::is_same_v<E, Plain<float>>) return divideFloats(d, count, n);
  for (size_t i = 0; i < count; ++i) d[i] = E::store(E::load(d[i]) / n);
}

// AVG of integers as torch and NCCL define it: the (wrapped) sum divided by the world size,
// truncated toward zero, which is what C++ integer division does.
template <typename T>
void truncatedQuotient(void* data, size_t count, int worldSize) {
  T* d = static_cast<T*>(data);
  const auto n = static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(worldSize);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / n);
}

}  // namespace

void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: reduceFloating<Plain<float>>(acc, in, count, op); return;
    case DType::Float64: reduceFloating<Plain<double>>(acc, in, count, op); return;
    case DType::Float16: reduceFloating<WidenedHalf>(acc, in, count, op); return;
    case DType::BFloat16: reduceFloating<WidenedBFloat16>(acc, in, count, op); return;
    case DType::Int32: reduceInteger<int32_t>(acc, in, count, op); return;
    case DType::Int64: reduceInteger<int64_t>(acc, in, count, op); return;
    case DType::Int8: reduceInteger<int8_t>(acc, in, count, op); return;
    case DType::UInt8: reduceInteger<uint8_t>(acc, in, count, op); return;
    case DType::Int16: reduceInteger<int16_t>(acc, in, count, op); return;
    case DType::Bool: reduceBool(acc, in, count, op); return;
  }
  throw InvalidArgument(makeString("reduce: unknown dtype code ", static_cast<int>(dtype)));
}

void finishAverage(void* data, size_t count, DType dtype, int worldSize) {
  switch (dtype) {
    case DType::Float32: divideBy<Plain<float>>(data, count, worldSize); return;
    case DType::Float64: divideBy<Plain<double>>(data, count, worldSize); return;
    case DType::Float16: divideBy<WidenedHalf>(data, count, worldSize); return;
    case DType::BFloat16: divideBy<WidenedBFloat16>(data, count, worldSize); return;
    case DType::Int32: truncatedQuotient<int32_t>(data, count, worldSize); return;
    case DType::Int64: truncatedQuotient<int64_t>(data, count, worldSize); return;
    case DType::Int8: truncatedQuotient<int8_t>(data, count, worldSize); return;
    case DType::UInt8: truncatedQuotient<uint8_t>(data, count, worldSize); return;
    case DType::Int16: truncatedQuotient<int16_t>(data, count, worldSize); return;
    case DType::Bool: return;  // checkReduceOp refused it before anything was sent
  }
}

namespace {

// Up to kMaxSources float32 sources in one pass: d = (((s0 + s1) + s2) + ...), then times 1/n (n a power of
// two) or divided by n: the bits of copying s0, reduceInto for each next source in order and finishAverage,
// without writing the partial sums back and reading them again (1.4-1.75x faster than those passes at 3-8
// sources, single core, 64 KiB pieces). No multiply-add to contract (-ffp-contract=off).
enum class Finish { None, Multiply, Divide };

template <int N, Finish F>
[[gnu::always_inline]] inline void sumSourcesBody(float* __restrict d, const float* const* s, size_t n, float k) {
  const float* __restrict p[N];
  for (int r = 0; r < N; ++r) p[r] = s[r];
  for (size_t i = 0; i < n; ++i) {
    float v = p[0][i] + p[1][i];
    for (int r = 2; r < N; ++r) v = v + p[r][i];
    if constexpr (F == Finish::Multiply) v = v * k;
    if constexpr (F == Finish::Divide) v = v / k;
    d[i] = v;
  }
}

#define CYXWIZ_SUM_SOURCES(N)                                                                                  \
  CYXWIZ_CPU_CLONES void sumSources##N(float* d, const float* const* s, size_t n, float k, Finish f) {        \
    if (f == Finish::None) return sumSourcesBody<N, Finish::None>(d, s, n, k);                                 \
    if (f == Finish::Multiply) return sumSourcesBody<N, Finish::Multiply>(d, s, n, k);                         \
    sumSourcesBody<N, Finish::Divide>(d, s, n, k);                                                             \
  }
CYXWIZ_SUM_SOURCES(2)
CYXWIZ_SUM_SOURCES(3)
CYXWIZ_SUM_SOURCES(4)
CYXWIZ_SUM_SOURCES(5)
CYXWIZ_SUM_SOURCES(6)
CYXWIZ_SUM_SOURCES(7)
CYXWIZ_SUM_SOURCES(8)
#undef CYXWIZ_SUM_SOURCES

}  // namespace

bool reduceSources(void* d, const void* const* sources, size_t n, size_t count, DType dtype, ReduceOp op) {
  if (dtype != DType::Float32 || (op != ReduceOp::Sum && op != ReduceOp::Avg) || n < 2 || n > kMaxSources) return false;
  auto* out = static_cast<float*>(d);
  const auto* s = reinterpret_cast<const float* const*>(sources);
  // finishAverage's choice: by a power of two a multiply by 1/n, otherwise a divide.
  const bool powerOfTwo = (n & (n - 1)) == 0;
  const Finish f = op == ReduceOp::Sum ? Finish::None : powerOfTwo ? Finish::Multiply : Finish::Divide;
  const float k = f == Finish::Multiply ? 1.0f / static_cast<float>(n) : static_cast<float>(n);
  switch (n) {
    case 2: sumSources2(out, s, count, k, f); break;
    case 3: sumSources3(out, s, count, k, f); break;
    case 4: sumSources4(out, s, count, k, f); break;
    case 5: sumSources5(out, s, count, k, f); break;
    case 6: sumSources6(out, s, count, k, f); break;
    case 7: sumSources7(out, s, count, k, f); break;
    default: sumSources8(out, s, count, k, f); break;
  }
  return true;
}

bool reduceTwoRounded(float* d, const float* a, const float* b, size_t count, DType wire, float scale, bool average) {
  if (wire != DType::BFloat16) return false;
  // AVG of two: times 1/2, which finishAverage's power-of-two branch also does (k = 1: a sum, exact).
  twoRoundedBf16(d, a, b, count, scale, average ? 0.5f : 1.0f);
  return true;
}

void roundScaled(float* acc, const float* in, size_t count, DType wire, float scale) {
  if (wire == DType::BFloat16) return roundScaledBf16(acc, in, count, scale);
  roundedHalfBlocks(acc, count, [&](size_t i) { return in[i] * scale; });
}

void sumRounded(float* acc, const float* in, size_t count, DType wire, float scale) {
  if (wire == DType::BFloat16) return sumRoundedBf16(acc, in, count, scale);
  // acc holds float16 values: r(acc + r(in * scale)) in two blocked passes.
  constexpr size_t kBlock = 512;
  float t[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t m = std::min(kBlock, count - at);
    roundedHalfBlocks(t, m, [&](size_t i) { return in[at + i] * scale; });
    roundedHalfBlocks(acc + at, m, [&](size_t i) { return acc[at + i] + t[i]; });
  }
}

void finishAverageRounded(float* d, size_t count, DType wire, int worldSize) {
  const auto n = static_cast<float>(worldSize);
  if ((worldSize & (worldSize - 1)) == 0) {  // as divideBy: times 1/n, to the bit
    const float inverse = 1.0f / n;
    if (wire == DType::BFloat16) return scaleRoundedBf16(d, count, inverse);
    return roundedHalfBlocks(d, count, [&](size_t i) { return d[i] * inverse; });
  }
  if (wire == DType::BFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = roundBf16(d[i] / n);
    return;
  }
  roundedHalfBlocks(d, count, [&](size_t i) { return d[i] / n; });
}

void checkReduceOp(ReduceOp op, DType dtype, const char* what) {
  if (op == ReduceOp::Avg && dtype == DType::Bool) {
    throw InvalidArgument(makeString(rankPrefix(), what, ": ReduceOp.AVG of a bool array has no meaning; use ReduceOp.MAX "
                                     "(any) or ReduceOp.MIN (all), or convert it to an integer or float type first"));
  }
}

}  // namespace cyxwiz::comm
