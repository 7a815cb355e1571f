// MultiHeadAttentionModule::decode: the key/value cache of generation (nn/generate.cpp).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/parallel.h"
#include "cyxwiz/nn/attention.h"
#include "cyxwiz/tensor/blas.h"

namespace cyxwiz::nn {

void MultiHeadAttentionModule::resetDecoding() {
  keys_ = {};
  values_ = {};
  decodedN_ = capacity_ = decoded_ = 0;
}

Tensor MultiHeadAttentionModule::decode(const Tensor& input, int64_t position) {
  requireInput(input, repr() + ".decode", 3, "(N, T, E)");
  outputShape(input.shape());
  CYX_CHECK(causal_ && !input.isCuda() && !inWeight_.value.isCuda(), repr(), ".decode: causal attention on the CPU only");
  const int64_t N = input.size(0), T = input.size(1), E = embed_, H = heads_, dh = E / H, L = position + T;
  CYX_CHECK(position == decoded_ && (decoded_ == 0 || N == decodedN_), repr(), ".decode: positions from ", position,
            " for ", N, " sequences, but ", decoded_, " positions of ", decodedN_, " are kept (resetDecoding first)");
  if (L > capacity_) {  // grow by doubling, the kept rows copied to their new places
    const int64_t capacity = std::max(L, 2 * capacity_);
    std::vector<float> keys(static_cast<size_t>(N * capacity * E)), values(keys.size());
    for (int64_t n = 0; n < N && decoded_ > 0; ++n) {
      std::copy_n(keys_.begin() + n * capacity_ * E, decoded_ * E, keys.begin() + n * capacity * E);
      std::copy_n(values_.begin() + n * capacity_ * E, decoded_ * E, values.begin() + n * capacity * E);
    }
    keys_.swap(keys);
    values_.swap(values);
    capacity_ = capacity;
  }
  decodedN_ = N;
  Tensor qkv = Tensor::empty({N * T, 3 * E});
  attention_cpu::project(input.data<float>(), inWeight_.value.data<float>(), bias_ ? inBias_.value.data<float>() : nullptr,
          qkv.data<float>(), N * T, E, 3 * E);
  const float* q = qkv.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t t = 0; t < T; ++t) {
      const float* row = q + (n * T + t) * 3 * E;
      std::copy_n(row + E, E, keys_.begin() + (n * capacity_ + position + t) * E);
      std::copy_n(row + 2 * E, E, values_.begin() + (n * capacity_ + position + t) * E);
    }
  }
  Tensor attn = Tensor::empty({N * T, E});
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  parallelFor(N * H, 1, [&](int64_t first, int64_t last) {
    std::vector<float> scores(static_cast<size_t>(T * L));
    for (int64_t task = first; task < last; ++task) {
      const int64_t n = task / H, h = task % H;
      const float* k = keys_.data() + n * capacity_ * E + h * dh;
      const float* v = values_.data() + n * capacity_ * E + h * dh;
      float* s = scores.data();
      blas::sgemm(false, true, T, L, dh, scale, q + n * T * 3 * E + h * dh, 3 * E, k, E, 0.0f, s, L);
      for (int64_t t = 0; t < T; ++t) {  // query position + t sees keys 0 .. position + t
        float* r = s + t * L;
        const int64_t seen = position + t + 1;
        const float mx = *std::max_element(r, r + seen);
        double sum = 0.0;
        for (int64_t j = 0; j < seen; ++j) sum += r[j] = std::exp(r[j] - mx);
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < seen; ++j) r[j] *= inv;
        std::fill(r + seen, r + L, 0.0f);
      }
      blas::sgemm(false, false, T, dh, L, 1.0f, s, L, v, E, 0.0f, attn.data<float>() + n * T * E + h * dh, E);
    }
  });
  decoded_ = L;
  Tensor output = Tensor::empty({N, T, E});
  attention_cpu::project(attn.data<float>(), outWeight_.value.data<float>(), bias_ ? outBias_.value.data<float>() : nullptr,
          output.data<float>(), N * T, E, E);
  return output;
}

}  // namespace cyxwiz::nn
