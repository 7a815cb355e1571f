// The kernels' per-element and per-row math and index math, as __host__ __device__ functions: the
// .cu kernels call them on the GPU and the host emulator (tests/gpu/emulator/kernels) calls the same
// functions, so both run one code path. What stays device-only is how the work is spread over
// threads and the block reductions (kernel_utils.cuh); the emulator replays their order on the host.
//
// On the host this header needs no CUDA header. expf/erff/tanhf/exp/log/sqrtf/fmaxf are the C
// library's there and CUDA's math library on the device: both are within a few ulp, not bit-equal,
// and nvcc contracts a * b + c into FMAs where the host compiler does not, so results may differ in
// the last bits between the GPU and the emulator.
#pragma once

#include <math.h>  // the global expf, erff, tanhf, fmaxf... (also CUDA's on the device)
#include <stdint.h>
#include <string.h>  // memcpy: the host's bit casts

#include "cyxwiz/cuda/api.h"

#ifdef __CUDACC__
#define CX_HD __host__ __device__
#else
#define CX_HD
#endif

namespace cyxwiz::cuda {

// ---- kernels_elementwise.cu ----

CX_HD inline void fillElement(float* dst, int64_t i, float value) { dst[i] = value; }

// Flat over the output: element i of a rows x cols output takes the row's column i % cols.
CX_HD inline void broadcastRowsElement(const float* row, float* out, int64_t i, int64_t cols) {
  out[i] = row[i % cols];
}

CX_HD inline void multiplyElement(const float* a, const float* b, float* out, int64_t i) { out[i] = a[i] * b[i]; }

// out may be a or b: element i is read before it is written, by the same thread.
CX_HD inline void addElement(const float* a, const float* b, float* out, int64_t i) { out[i] = a[i] + b[i]; }

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

CX_HD inline constexpr bool knownActivation(Activation f) {
  return f == Activation::ReLU || f == Activation::GELU || f == Activation::Sigmoid || f == Activation::Tanh ||
         f == Activation::LeakyReLU || f == Activation::ELU || f == Activation::Swish || f == Activation::Mish;
}

// Branch on the sign so exp never overflows.
CX_HD inline float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// log(1 + e^x), x itself above torch's threshold of 20 (nn/activations.cpp).
CX_HD inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// f(x), formulas as nn/relu.cpp, gelu.cpp, sigmoid.cpp, tanh.cpp and activations.cpp. `param`:
// LeakyReLU's negative slope, ELU's alpha; the others ignore it.
template <Activation F>
CX_HD inline float activate(float x, float param) {
  (void)param;
  if constexpr (F == Activation::ReLU) return x > 0.0f ? x : 0.0f;
  if constexpr (F == Activation::GELU) return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  if constexpr (F == Activation::Sigmoid) return sigmoid(x);
  if constexpr (F == Activation::Tanh) return tanhf(x);
  if constexpr (F == Activation::LeakyReLU) return x > 0.0f ? x : x * param;
  if constexpr (F == Activation::ELU) return x > 0.0f ? x : param * expm1f(x);
  if constexpr (F == Activation::Swish) return x * sigmoid(x);
  if constexpr (F == Activation::Mish) return x * tanhf(softplus(x));
  return x;
}

// g * f'(x), f' at the layer input x.
template <Activation F>
CX_HD inline float activateGrad(float x, float g, float param) {
  (void)param;
  if constexpr (F == Activation::ReLU) return x > 0.0f ? g : 0.0f;
  if constexpr (F == Activation::GELU) {
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return g * (cdf + x * pdf);
  }
  if constexpr (F == Activation::Sigmoid) {
    const float y = sigmoid(x);
    return g * y * (1.0f - y);
  }
  if constexpr (F == Activation::Tanh) {
    const float y = tanhf(x);
    return g * (1.0f - y * y);
  }
  if constexpr (F == Activation::LeakyReLU) return g * (x > 0.0f ? 1.0f : param);
  if constexpr (F == Activation::ELU) return g * (x > 0.0f ? 1.0f : param * expf(x));
  if constexpr (F == Activation::Swish) {
    const float s = sigmoid(x);
    return g * (s * (1.0f + x * (1.0f - s)));
  }
  if constexpr (F == Activation::Mish) {
    const float t = tanhf(softplus(x));
    return g * (t + x * sigmoid(x) * (1.0f - t * t));
  }
  return g;
}

template <Activation F>
CX_HD inline void activationForwardElement(const float* x, float* y, int64_t i, float param) {
  y[i] = activate<F>(x[i], param);
}

template <Activation F>
CX_HD inline void activationBackwardElement(const float* x, const float* g, float* dx, int64_t i, float param) {
  dx[i] = activateGrad<F>(x[i], g[i], param);
}

// Output i of the splitmix64 generator seeded with `seed`: a counter-based stream, so element i's
// draw depends only on (seed, i), whatever the launch configuration.
CX_HD inline uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The top 24 bits, as cyxwiz::uniform01: exactly representable floats in [0, 1).
CX_HD inline float dropoutUniform(uint64_t seed, int64_t i) {
  return static_cast<float>(splitmix64(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
}

// The seed comes from device memory when given (a graphed step's per-replay seed), read when the
// kernel runs.
CX_HD inline uint64_t dropoutSeed(uint64_t seed, const uint64_t* seedOnDevice) {
  return seedOnDevice ? *seedOnDevice : seed;
}

CX_HD inline void dropoutElement(const float* x, float* y, float* mask, int64_t i, float keep, float scale,
                                 uint64_t seed) {
  const float m = dropoutUniform(seed, i) < keep ? scale : 0.0f;
  mask[i] = m;
  y[i] = x[i] * m;
}

// ---- kernels_convert.cu: float32 <-> float16 / bfloat16, bit for bit as cyxwiz/tensor/half.h ----
//
// The same formulas as half.h (integer operations, and for float16 float32 arithmetic that rounds
// exactly once per operation), not CUDA's __float2half_rn / __float2bfloat16_rn: those round alike but
// return a canonical NaN, where the host keeps the NaN's sign. On the device the float operations are
// __fmul_rn / __fadd_rn, which nvcc never fuses into an FMA; the kernels are built without
// --use_fast_math, so subnormals are not flushed, as on the host.

CX_HD inline uint32_t bitsOfFloat(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

CX_HD inline float floatOfBits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

CX_HD inline float mulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

CX_HD inline float addRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// half.h's floatToBFloat16: nearest, ties to even; NaN stays NaN (quiet, sign kept).
CX_HD inline uint16_t bfloat16Bits(float f) {
  const uint32_t x = bitsOfFloat(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t isNan = 0u - static_cast<uint32_t>((x & 0x7fffffffu) > 0x7f800000u);
  return static_cast<uint16_t>((((x >> 16) | 0x40u) & isNan) | (rounded & ~isNan));
}

// half.h's floatToHalf (the FP16 library's): nearest, ties to even; beyond 65520 Inf; NaN stays NaN.
CX_HD inline uint16_t halfBits(float f) {
  const uint32_t w = bitsOfFloat(f), shl1W = w + w, sign = w & 0x80000000u;
  float base = mulRn(mulRn(floatOfBits(w & 0x7fffffffu), 0x1.0p+112f), 0x1.0p-110f);
  uint32_t bias = shl1W & 0xFF000000u;
  bias = bias > 0x71000000u ? bias : 0x71000000u;
  base = addRn(floatOfBits((bias >> 1) + 0x07800000u), base);
  const uint32_t bits = bitsOfFloat(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  const uint32_t isNan = 0u - static_cast<uint32_t>(shl1W > 0xFF000000u);
  return static_cast<uint16_t>((sign >> 16) | (0x7E00u & isNan) | (nonsign & ~isNan));
}

CX_HD inline float bfloat16Value(uint16_t b) { return floatOfBits(static_cast<uint32_t>(b) << 16); }

// half.h's halfToFloat: exact.
CX_HD inline float halfValue(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16, sign = w & 0x80000000u, twoW = w + w;
  const float normal = mulRn(floatOfBits((twoW >> 4) + (0xE0u << 23)), 0x1.0p-112f);
  const float subnormal = addRn(floatOfBits((twoW >> 17) | (126u << 23)), -0.5f);
  const uint32_t isSubnormal = 0u - static_cast<uint32_t>(twoW < (1u << 27));
  return floatOfBits(sign | (bitsOfFloat(subnormal) & isSubnormal) | (bitsOfFloat(normal) & ~isSubnormal));
}

// One element of a narrowing: T is ElemType::Float16 or BFloat16. A NaN is not scaled (the GPU's
// multiply would return a canonical NaN, the host's keeps the sign: both round the original).
template <ElemType T>
CX_HD inline void narrowElement(const float* in, uint16_t* out, int64_t i, float scale) {
  float x = in[i];
  if (scale != 1.0f && x == x) x = mulRn(x, scale);
  out[i] = T == ElemType::BFloat16 ? bfloat16Bits(x) : halfBits(x);
}

template <ElemType T>
CX_HD inline void widenElement(const uint16_t* in, float* out, int64_t i) {
  out[i] = T == ElemType::BFloat16 ? bfloat16Value(in[i]) : halfValue(in[i]);
}

// ---- autocast and GradScaler (kernels_mixed.cu, and the 16-bit column sums of kernels_elementwise.cu) ----

// An element of a 16-bit (T = Float16 / BFloat16) or float32 (T = Float32) buffer, as float32: exact.
template <ElemType T>
CX_HD inline float loadFloat(const void* p, int64_t i) {
  if constexpr (T == ElemType::Float32) return static_cast<const float*>(p)[i];
  const uint16_t v = static_cast<const uint16_t*>(p)[i];
  return T == ElemType::BFloat16 ? bfloat16Value(v) : halfValue(v);
}

// ReLU's backward from the 16-bit copy forward kept: the mask is that copy's sign (nn/relu.cpp's maskFrom16).
template <ElemType T>
CX_HD inline void reluBackward16Element(const uint16_t* x, const float* g, float* dx, int64_t i) {
  dx[i] = loadFloat<T>(x, i) > 0.0f ? g[i] : 0.0f;
}

// out[i] = in[i] * factor; true when the result is Inf or NaN (an exponent of all ones), as
// nn/grad_scaler.cpp's unscaleInPlace.
CX_HD inline bool scaleElement(const float* in, float* out, int64_t i, float factor) {
  const float v = mulRn(in[i], factor);
  out[i] = v;
  return (bitsOfFloat(v) & 0x7f800000u) == 0x7f800000u;
}

// ---- kernels_loss.cu: the per-element pieces of the row reductions ----

// Softmax numerator of x in a row of maximum mx.
CX_HD inline float softmaxNumerator(float x, float mx) { return expf(x - mx); }

// 1 / (sum of a row's numerators), summed in double.
CX_HD inline float inverseSum(double sum) { return static_cast<float>(1.0 / sum); }

// softmax backward: the row's dot(g, y) terms, then dx = y (g - dot).
CX_HD inline double softmaxDotTerm(float g, float y) { return static_cast<double>(g) * y; }
CX_HD inline float softmaxBackwardElement(float y, float g, float dot) { return y * (g - dot); }

// Cross-entropy forward, per row: logSumExp = mx + log(sum exp(x - mx)) in double, then
// logSumExp - x[label], or sum_c p_c (logSumExp - x_c).
CX_HD inline double logSumExpTerm(float x, float mx) { return exp(static_cast<double>(x - mx)); }
CX_HD inline double logSumExp(float mx, double sum) { return mx + log(sum); }
CX_HD inline double labelRowLoss(double logSumExp, const float* xr, int64_t label) { return logSumExp - xr[label]; }
CX_HD inline double probsLossTerm(float p, double logSumExp, float x) { return p * (logSumExp - x); }

// Cross-entropy backward, d(mean loss)/d(logits) from the numerator e and inv = 1 / sum:
// (softmax - onehot) / rows, or (softmax * mass - p) / rows.
CX_HD inline float crossEntropyLabelGrad(float e, float inv, bool isLabel, float invRows) {
  float v = e * inv;
  if (isLabel) v -= 1.0f;
  return v * invRows;
}
CX_HD inline float crossEntropyProbsGrad(float e, float inv, float mass, float p, float invRows) {
  return (e * inv * mass - p) * invRows;
}

CX_HD inline double squaredErrorTerm(const float* y, const float* t, int64_t i) {
  const double d = static_cast<double>(y[i]) - t[i];
  return d * d;
}

CX_HD inline void mseBackwardElement(const float* y, const float* t, float* grad, int64_t i, float scale) {
  grad[i] = scale * (y[i] - t[i]);
}

// Argmax keeping the first maximum, as std::max_element (NaNs never win here, whereas
// std::max_element keeps a NaN found in first position). Associative and commutative, so any
// reduction order gives the same answer.
struct ArgMax {
  float value;
  int64_t index;
};

constexpr int64_t kNoIndex = INT64_MAX;

CX_HD inline ArgMax better(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

// The reduction's start (no candidate yet) and its answer: an all-NaN row gives 0, as the CPU.
CX_HD inline ArgMax noArgMax() { return ArgMax{-INFINITY, kNoIndex}; }
CX_HD inline int64_t argMaxIndex(ArgMax a) { return a.index == kNoIndex ? 0 : a.index; }

// ---- kernels_batchnorm.cu: x (n, c, s), formulas as nn/batchnorm.cpp, statistics in double ----

// Walks the values e = first, first + step, ... of one channel's n * s; value e = i * s + j lies at
// offset() + ch * s of x. Incremental, so no 64-bit division per element (the kernels' steps are fixed).
struct ChannelWalk {
  int64_t e, step, i, j, di, dj, s, cs;
  CX_HD ChannelWalk(int64_t first, int64_t step, int64_t c, int64_t s)
      : e(first), step(step), i(first / s), j(first % s), di(step / s), dj(step % s), s(s), cs(c * s) {}
  CX_HD void next() {
    e += step;
    i += di;
    j += dj;
    if (j >= s) {
      j -= s;
      ++i;
    }
  }
  CX_HD int64_t offset() const { return i * cs + j; }
};

// The reductions' terms: x, (x - mean)^2, and for the gradient dy and dy (x - mean) (times invstd
// once per channel, at the end, as the CPU).
CX_HD inline double squaredDeviation(float x, double mean) {
  const double d = x - mean;
  return d * d;
}
CX_HD inline double deviationProduct(float dy, float x, double mean) { return dy * (x - mean); }

// The finish of a two-pass channel reduction: slot's `splits` partials added in order. In place
// when splits is 1 (the first pass wrote the slot itself).
CX_HD inline double partialsSum(const double* partial, int splits, int64_t slot) {
  double acc = 0.0;
  for (int p = 0; p < splits; ++p) acc += partial[slot * splits + p];
  return acc;
}

// Training statistics of channel ch from the (all-reduced) sums, count = sums[c].
CX_HD inline void batchNormTrainingStatistics(int64_t ch, int64_t c, const double* sums, const double* squares,
                                              double eps, double momentum, float* runningMean, float* runningVar,
                                              double* mean, double* invstd) {
  const double count = sums[c];
  const double m = sums[ch] / count, var = squares[ch] / count;
  mean[ch] = m;
  invstd[ch] = 1.0 / sqrt(var + eps);
  runningMean[ch] = static_cast<float>((1.0 - momentum) * runningMean[ch] + momentum * m);
  runningVar[ch] = static_cast<float>((1.0 - momentum) * runningVar[ch] + momentum * var * count / (count - 1.0));
}

CX_HD inline void batchNormEvalStatistics(int64_t ch, double eps, const float* runningMean, const float* runningVar,
                                          double* mean, double* invstd) {
  mean[ch] = runningMean[ch];
  invstd[ch] = 1.0 / sqrt(static_cast<double>(runningVar[ch]) + eps);
}

// y = x scale + shift, scale = w invstd and shift = b - mean scale in double, then float (as the CPU).
struct ChannelAffine {
  float scale, shift;
};

CX_HD inline ChannelAffine batchNormAffine(float w, float b, double mean, double invstd) {
  const double scale = w * invstd;
  return ChannelAffine{static_cast<float>(scale), static_cast<float>(b - mean * scale)};
}

CX_HD inline float batchNormApplyElement(float x, ChannelAffine a) { return x * a.scale + a.shift; }

// The gradient sums' finish of channel ch: sum(dy (x - mean)) times invstd, and the parameters'
// gradients when given.
CX_HD inline void batchNormGradFinish(int64_t ch, int64_t c, const double* partial, int splits,
                                      const double* invstd, double* gradSums, float* dweight, float* dbias) {
  const double sumDy = partialsSum(partial, splits, ch);
  const double sumDyXhat = partialsSum(partial, splits, c + ch) * invstd[ch];
  gradSums[ch] = sumDy;
  gradSums[c + ch] = sumDyXhat;
  if (dweight) dweight[ch] += static_cast<float>(sumDyXhat);
  if (dbias) dbias[ch] += static_cast<float>(sumDy);
}

// dx = a dy + bx (x - m) + c0 per channel (nn/batchnorm.cpp's backward, in float); count null
// (eval statistics): meanDy = meanDyXhat = 0, so dx = k dy.
struct BatchNormGradCoefficients {
  float a, bx, c0, m;
};

CX_HD inline BatchNormGradCoefficients batchNormGradCoefficients(int64_t ch, int64_t c, float w, double mean,
                                                                 double invstd, const double* gradSums,
                                                                 const double* count) {
  const double k = w * invstd;
  const double meanDy = count ? gradSums[ch] / *count : 0.0;
  const double meanDyXhat = count ? gradSums[c + ch] / *count : 0.0;
  return BatchNormGradCoefficients{static_cast<float>(k), static_cast<float>(-k * meanDyXhat * invstd),
                                   static_cast<float>(-k * meanDy), static_cast<float>(mean)};
}

CX_HD inline float batchNormGradElement(float x, float dy, BatchNormGradCoefficients k) {
  return k.a * dy + k.bx * (x - k.m) + k.c0;
}

// ---- the sequence layers: kernels_embedding.cu, kernels_layernorm.cu, kernels_attention.cu ----

// Position i's id as a row of a `vocab`-row table, or -1 when it names none: an integer outside
// [0, vocab), or a float32 that is not a whole number in that range (nn/embedding.cpp's checks; the
// float is range-checked before the cast, which beyond int64 would be undefined).
CX_HD inline int64_t tokenId(const void* ids, ElemType type, int64_t i, int64_t vocab) {
  int64_t id;
  if (type == ElemType::Float32) {
    const float v = static_cast<const float*>(ids)[i];
    if (!(v >= 0.0f && v < static_cast<float>(vocab)) || floorf(v) != v) return -1;
    id = static_cast<int64_t>(v);
  } else if (type == ElemType::Int64) {
    id = static_cast<const int64_t*>(ids)[i];
  } else {
    id = static_cast<const int32_t*>(ids)[i];
  }
  return id >= 0 && id < vocab ? id : -1;
}

// An invalid id's row is zeros: nothing outside the table is read.
CX_HD inline float embeddingElement(const float* table, int64_t id, int64_t dim, int64_t d) {
  return id >= 0 ? table[id * dim + d] : 0.0f;
}

// LayerNorm's row statistics from the two double passes (sum, then squared deviations from its
// mean), stored as float as the CPU module does.
struct RowStatistics {
  float mean, rstd;
};

CX_HD inline RowStatistics layerNormStatistics(double sum, double squares, int64_t dim, double eps) {
  const double d = static_cast<double>(dim);
  return RowStatistics{static_cast<float>(sum / d), static_cast<float>(1.0 / sqrt(squares / d + eps))};
}

CX_HD inline float layerNormXhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

CX_HD inline float layerNormElement(float x, float mean, float rstd, float w, float b) {
  return layerNormXhat(x, mean, rstd) * w + b;
}

// Backward, per row: the sums of gw = g w and gw xhat in double, their means as float, then
// dx = rstd (gw - mean(gw) - xhat mean(gw xhat)).
CX_HD inline double layerNormGw(float g, float w) { return static_cast<double>(g) * w; }

CX_HD inline float layerNormGradElement(float x, float g, float w, float mean, float rstd, float meanGw,
                                        float meanGwXhat) {
  return rstd * (g * w - meanGw - layerNormXhat(x, mean, rstd) * meanGwXhat);
}

// The parameters' terms of one element: dweight's g xhat and dbias's g, in double.
CX_HD inline double layerNormWeightTerm(float x, float g, float mean, float rstd) {
  return static_cast<double>(g) * layerNormXhat(x, mean, rstd);
}

// The keys row `row` of a masked softmax sees: all `cols`, or when causal those up to its query,
// row % cols (square score matrices stacked by rows).
CX_HD inline int64_t softmaxSeen(int64_t row, int64_t cols, bool causal) { return causal ? row % cols + 1 : cols; }

// ---- kernels_optim.cu: nn/sgd.cpp and nn/adam.cpp per element ----

// Scalars from device memory (a graphed step's per-replay values), read when the kernel runs.
CX_HD inline float sgdLearningRate(float lr, const float* scalars) { return scalars ? scalars[0] : lr; }

struct AdamScalars {
  float stepSize, invSqrtBc2, decay;
};

CX_HD inline AdamScalars adamScalars(AdamScalars given, const float* scalars) {
  return scalars ? AdamScalars{scalars[0], scalars[1], scalars[2]} : given;
}

// A zero buffer makes the first step buf = g, as torch's first-step rule.
CX_HD inline void sgdElement(const OptimizerTensor& t, int64_t i, float lr, float mu, float wd, bool nesterov) {
  const float g = t.g[i] + wd * t.p[i];
  if (!t.m) {
    t.p[i] -= lr * g;
    return;
  }
  const float b = mu * t.m[i] + g;
  t.m[i] = b;
  t.p[i] -= lr * (nesterov ? g + mu * b : b);
}

CX_HD inline void adamElement(const OptimizerTensor& t, int64_t i, AdamScalars s, float b1, float b2, float eps,
                              float l2) {
  const float pi = t.p[i];
  const float g = t.g[i] + l2 * pi;
  const float mi = b1 * t.m[i] + (1.0f - b1) * g;
  const float vi = b2 * t.v[i] + (1.0f - b2) * g * g;
  t.m[i] = mi;
  t.v[i] = vi;
  t.p[i] = pi * s.decay - s.stepSize * mi / (sqrtf(vi) * s.invSqrtBc2 + eps);
}

// ---- blas.cu ----

// C = beta * C for k = 0. beta = 0 writes zeros, as BLAS, so NaNs in an uninitialised C do not survive.
CX_HD inline void scaleMatrixElement(float* c, int64_t r, int64_t j, int64_t ldc, float beta) {
  float& x = c[r * ldc + j];
  x = beta == 0.0f ? 0.0f : beta * x;
}

}  // namespace cyxwiz::cuda
