#include "cyxwiz/nn/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cyxwiz/common/parallel.h"
#include "cyxwiz/nn/fast_exp.h"
#include "cyxwiz/platform/cpu.h"
#include "cyxwiz/tensor/blas.h"

namespace cyxwiz::nn::attention_cpu {

namespace {

constexpr int64_t kQueryBlock = 64;  // rows of scores per GEMM: 64 x T floats of scratch a thread

// One (sample, head): where its Q, K, V rows start in qkv (row stride 3E) and its columns of out (stride E).
struct Head {
  const float* q;
  const float* k;
  const float* v;
  int64_t outOffset;  // of row 0 in out / dout; in qkv / dqkv it is n T 3E + h dh
  int64_t qkvOffset;
  uint64_t maskBase;  // (n H + h) T T: the first (query, key) counter of this head's dropout
};

Head headAt(const Dims& d, const float* qkv, int64_t task) {
  const int64_t n = task / d.heads, h = task % d.heads, E = d.e, dh = E / d.heads;
  const int64_t qkvOffset = n * d.t * 3 * E + h * dh;
  return {qkv + qkvOffset, qkv + qkvOffset + E, qkv + qkvOffset + 2 * E, n * d.t * E + h * dh, qkvOffset,
          static_cast<uint64_t>(task) * static_cast<uint64_t>(d.t) * static_cast<uint64_t>(d.t)};
}

// Keys query i may see: all, or 0..i. A block of queries [i0, i0 + rows) needs keys [0, keysFor(last)).
int64_t keysSeen(const Dims& d, int64_t i) { return d.causal ? i + 1 : d.t; }

// The dropout factor of one weight: 1/keep or 0, from splitmix64 of the counter (a stateless draw, so
// backward finds the same decisions and any thread count draws the same mask).
inline float dropFactor(const Dropout& drop, uint64_t counter) {
  uint64_t z = drop.seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return u < drop.keep ? 1.0f / drop.keep : 0.0f;
}

void applyDropout(const Dropout& drop, uint64_t rowCounter, float* w, int64_t seen) {
  for (int64_t j = 0; j < seen; ++j) w[j] *= dropFactor(drop, rowCounter + static_cast<uint64_t>(j));
}

// The per-row loops below are cloned per instruction set (platform/cpu.h): built for baseline x86-64
// their exps and sums ran on SSE2. -ffp-contract=off keeps every clone's bits the same.

// In place over one row's visible scores s[0, seen): s = e^(s - max), returns their sum. Two loops, so the
// first (the exps) vectorises; the sum runs in eight lanes, as a vector would.
CYXWIZ_CPU_CLONES float expShifted(float* s, int64_t seen, float shift) {
  for (int64_t j = 0; j < seen; ++j) s[j] = expNonPositive(s[j] - shift);
  float lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= seen; j += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += s[j + l];
  }
  for (; j < seen; ++j) lane[0] += s[j];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// One row of scores [0, keys), of which [0, seen) are visible, into the softmax's weights (the rest 0);
// returns the log-sum-exp backward recomputes the weights from.
CYXWIZ_CPU_CLONES float softmaxRow(float* row, int64_t seen, int64_t keys) {
  const float mx = maxOfRow(row, seen);
  const float sum = expShifted(row, seen, mx);
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < seen; ++j) row[j] *= inv;
  std::fill(row + seen, row + keys, 0.0f);
  return mx + std::log(sum);
}

// The weights again from the row's scores and its log-sum-exp l.
CYXWIZ_CPU_CLONES void weightsFromScores(float* row, int64_t seen, int64_t keys, float l) {
  for (int64_t j = 0; j < seen; ++j) row[j] = expNonPositive(row[j] - l);
  std::fill(row + seen, row + keys, 0.0f);
}

// g = w (g - sum_j g_j w_j) over the visible keys, 0 beyond: the softmax's Jacobian applied to one row's
// gradient g of its weights w. The dot runs in double over eight lanes, added in lane order.
CYXWIZ_CPU_CLONES void softmaxGradRow(float* g, const float* w, int64_t seen, int64_t keys) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= seen; j += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(g[j + l]) * w[j + l];
  }
  double dot = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; j < seen; ++j) dot += static_cast<double>(g[j]) * w[j];
  const float c = static_cast<float>(dot);
  for (j = 0; j < seen; ++j) g[j] = w[j] * (g[j] - c);
  std::fill(g + seen, g + keys, 0.0f);
}

}  // namespace

// y (R, out) = x (R, in) w^T (+ b): the bias seeds each row, the product adds onto it.
void project(const float* x, const float* w, const float* b, float* y, int64_t R, int64_t in, int64_t out) {
  if (b) {
    for (int64_t r = 0; r < R; ++r) std::copy(b, b + out, y + r * out);
  }
  blas::sgemm(false, true, R, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

void forward(const Dims& d, const Dropout& drop, const float* qkv, float* out, float* lse) {
  const int64_t T = d.t, E = d.e, dh = E / d.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  parallelFor(d.n * d.heads, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scores(static_cast<size_t>(std::min(kQueryBlock, T) * T));
    for (int64_t task = first; task < last; ++task) {
      const Head hd = headAt(d, qkv, task);
      for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, T - i0), keys = keysSeen(d, i0 + rows - 1);
        float* s = scores.data();  // rows x keys, leading dimension keys
        blas::sgemm(false, true, rows, keys, dh, scale, hd.q + i0 * 3 * E, 3 * E, hd.k, 3 * E, 0.0f, s, keys);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r, seen = keysSeen(d, i);
          float* row = s + r * keys;
          lse[task * T + i] = softmaxRow(row, seen, keys);
          if (drop.on()) applyDropout(drop, hd.maskBase + static_cast<uint64_t>(i * T), row, seen);
        }
        blas::sgemm(false, false, rows, dh, keys, 1.0f, s, keys, hd.v, 3 * E, 0.0f, out + hd.outOffset + i0 * E, E);
      }
    }
  });
}

void backward(const Dims& d, const Dropout& drop, const float* qkv, const float* lse, const float* dout,
              float* dqkv) {
  const int64_t T = d.t, E = d.e, dh = E / d.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  parallelFor(d.n * d.heads, 1, [&](int64_t first, int64_t last) {
    const size_t block = static_cast<size_t>(std::min(kQueryBlock, T) * T);
    std::vector<float> weights(block), dweights(block), dropped(drop.on() ? block : 0);
    for (int64_t task = first; task < last; ++task) {
      const Head hd = headAt(d, qkv, task);
      const float* dO = dout + hd.outOffset;
      float* dq = dqkv + hd.qkvOffset;
      float* dk = dq + E;
      float* dv = dq + 2 * E;
      // dK and dV gather from every block of queries: zero, then add.
      for (int64_t j = 0; j < T; ++j) {
        std::fill(dk + j * 3 * E, dk + j * 3 * E + dh, 0.0f);
        std::fill(dv + j * 3 * E, dv + j * 3 * E + dh, 0.0f);
      }
      for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, T - i0), keys = keysSeen(d, i0 + rows - 1);
        float* p = weights.data();
        float* dp = dweights.data();
        // P again from the scores and the saved log-sum-exp.
        blas::sgemm(false, true, rows, keys, dh, scale, hd.q + i0 * 3 * E, 3 * E, hd.k, 3 * E, 0.0f, p, keys);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r, seen = keysSeen(d, i);
          float* row = p + r * keys;
          weightsFromScores(row, seen, keys, lse[task * T + i]);
        }
        const float* used = p;  // the weights forward multiplied V by
        if (drop.on()) {
          std::copy(p, p + rows * keys, dropped.data());
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            applyDropout(drop, hd.maskBase + static_cast<uint64_t>(i * T), dropped.data() + r * keys, keysSeen(d, i));
          }
          used = dropped.data();
        }
        // dV += used^T dO; dP = dO V^T (then through the mask); dS = P (dP - sum_j dP_j P_j), the softmax's
        // Jacobian. Each block holds whole rows, so the sum comes from the very dP it is subtracted from
        // (with one key, dS is exactly 0, as it is mathematically).
        blas::sgemm(true, false, keys, dh, rows, 1.0f, used, keys, dO + i0 * E, E, 1.0f, dv, 3 * E);
        blas::sgemm(false, true, rows, keys, dh, 1.0f, dO + i0 * E, E, hd.v, 3 * E, 0.0f, dp, keys);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r, seen = keysSeen(d, i);
          float* g = dp + r * keys;
          const float* w = p + r * keys;
          if (drop.on()) applyDropout(drop, hd.maskBase + static_cast<uint64_t>(i * T), g, seen);
          softmaxGradRow(g, w, seen, keys);
        }
        // dQ = dS K scale (this block's rows); dK += dS^T Q scale.
        blas::sgemm(false, false, rows, dh, keys, scale, dp, keys, hd.k, 3 * E, 0.0f, dq + i0 * 3 * E, 3 * E);
        blas::sgemm(true, false, keys, dh, rows, scale, dp, keys, hd.q + i0 * 3 * E, 3 * E, 1.0f, dk, 3 * E);
      }
    }
  });
}

}  // namespace cyxwiz::nn::attention_cpu
