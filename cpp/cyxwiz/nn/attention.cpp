#include "cyxwiz/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/parallel.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

namespace {

// y (R, out) = x (R, in) w^T (+ b): the bias seeds each row, the product adds onto it.
void project(const float* x, const float* w, const float* b, float* y, int64_t R, int64_t in, int64_t out) {
  if (b) {
    for (int64_t r = 0; r < R; ++r) std::copy(b, b + out, y + r * out);
  }
  blas::sgemm(false, true, R, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

// dw += g^T x, db += column sums of g, then dx = g w when dx is not null.
void projectBackward(const float* x, const float* g, const float* w, float* dw, float* db, int64_t R, int64_t in,
                     int64_t out) {
  blas::sgemm(true, false, out, in, R, 1.0f, g, out, x, in, 1.0f, dw, in);
  if (!db) return;
  for (int64_t r = 0; r < R; ++r) {
    const float* gr = g + r * out;
    for (int64_t j = 0; j < out; ++j) db[j] += gr[j];
  }
}

// Row i of a T x T score matrix in place: softmax over the keys it may see (all, or 0..i when causal),
// the others 0.
void softmaxRow(float* s, int64_t i, int64_t T, bool causal) {
  const int64_t seen = causal ? i + 1 : T;
  const float mx = *std::max_element(s, s + seen);
  float sum = 0.0f;
  for (int64_t j = 0; j < seen; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < seen; ++j) s[j] *= inv;
  std::fill(s + seen, s + T, 0.0f);
}

}  // namespace

MultiHeadAttentionModule::MultiHeadAttentionModule(int64_t embedDim, int64_t numHeads, bool causal, double dropout, bool bias)
    : embed_(embedDim), heads_(numHeads), causal_(causal), dropout_(dropout), bias_(bias) {
  const std::string who = makeString("MultiHeadAttentionModule(", embedDim, ", ", numHeads, ")");
  CYX_CHECK(embedDim > 0 && numHeads > 0, who, ": embed_dim and num_heads must be positive");
  CYX_CHECK(embedDim % numHeads == 0, who, ": embed_dim must be divisible by num_heads (each head takes ",
            "embed_dim / num_heads features)");
  CYX_CHECK(dropout >= 0.0 && dropout < 1.0, who, ": dropout=", dropout, " must be in [0, 1)");
  const int64_t E = embed_;
  inWeight_ = {"in_proj_weight", Tensor::empty({3 * E, E}), Tensor::zeros({3 * E, E})};
  outWeight_ = {"out_proj.weight", Tensor::empty({E, E}), Tensor::zeros({E, E})};
  // torch: xavier_uniform_ on in_proj_weight (fan_in E, fan_out 3E), Linear's bound for out_proj, zero biases.
  fillUniform(inWeight_.value.data<float>(), 3 * E * E, std::sqrt(6.0f / static_cast<float>(4 * E)), globalGenerator());
  fillUniform(outWeight_.value.data<float>(), E * E, 1.0f / std::sqrt(static_cast<float>(E)), globalGenerator());
  if (bias_) {
    inBias_ = {"in_proj_bias", Tensor::zeros({3 * E}), Tensor::zeros({3 * E})};
    outBias_ = {"out_proj.bias", Tensor::zeros({E}), Tensor::zeros({E})};
  }
}

std::vector<Parameter*> MultiHeadAttentionModule::parameters() {
  if (bias_) return {&inWeight_, &inBias_, &outWeight_, &outBias_};
  return {&inWeight_, &outWeight_};
}

Shape MultiHeadAttentionModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, -1, embed_};
  if (input.size() != 3 || (input[2] >= 0 && input[2] != embed_)) {
    throw InvalidArgument(makeString(repr(), " expects input (N, T, ", embed_, "), got ", describeShape(input)));
  }
  return input;
}

Tensor MultiHeadAttentionModule::forward(const Tensor& input) {
  if (input.isCuda()) return forwardGpu(input);
  requireInput(input, repr() + ".forward", 3, "(N, T, E)");
  CYX_CHECK(!input.isCuda(), repr(), " has CPU kernels only and its input is on ", input.device().str());
  outputShape(input.shape());
  const int64_t N = input.size(0), T = input.size(1), E = embed_, H = heads_, dh = E / H, R = N * T;
  CYX_CHECK(T > 0, repr(), ".forward: the sequences are empty");
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  input_ = keepForBackward(input);
  qkv_ = Tensor::empty({R, 3 * E});
  project(input_.data<float>(), inWeight_.value.data<float>(), bias_ ? inBias_.value.data<float>() : nullptr,
          qkv_.data<float>(), R, E, 3 * E);
  probs_ = Tensor::empty({N, H, T, T});
  attn_ = Tensor::empty({R, E});
  const bool drop = training_ && dropout_ > 0.0;
  mask_ = Tensor();
  if (drop) {  // drawn in order on the caller's thread: the same masks whatever the thread count
    mask_ = Tensor::empty({N, H, T, T});
    const float keep = static_cast<float>(1.0 - dropout_), inv = 1.0f / keep;
    float* m = mask_.data<float>();
    auto& gen = globalGenerator();
    for (int64_t i = 0; i < mask_.numel(); ++i) m[i] = uniform01(gen) < keep ? inv : 0.0f;
  }
  const float* qkv = qkv_.data<float>();
  // One (sample, head) pair a task: each writes its own weights and its own columns of attn_.
  parallelFor(N * H, 1, [&](int64_t first, int64_t last) {
    std::vector<float> dropped(drop ? static_cast<size_t>(T * T) : 0);
    for (int64_t k = first; k < last; ++k) {
      const int64_t n = k / H, h = k % H;
      const float* q = qkv + n * T * 3 * E + h * dh;  // rows of stride 3E: Q, then K and V E and 2E further
      float* p = probs_.data<float>() + k * T * T;
      blas::sgemm(false, true, T, T, dh, scale, q, 3 * E, q + E, 3 * E, 0.0f, p, T);
      for (int64_t i = 0; i < T; ++i) softmaxRow(p + i * T, i, T, causal_);
      const float* weights = p;
      if (drop) {
        const float* m = mask_.data<float>() + k * T * T;
        for (int64_t i = 0; i < T * T; ++i) dropped[static_cast<size_t>(i)] = p[i] * m[i];
        weights = dropped.data();
      }
      blas::sgemm(false, false, T, dh, T, 1.0f, weights, T, q + 2 * E, 3 * E, 0.0f, attn_.data<float>() + n * T * E + h * dh, E);
    }
  });
  Tensor output = Tensor::empty({N, T, E});
  project(attn_.data<float>(), outWeight_.value.data<float>(), bias_ ? outBias_.value.data<float>() : nullptr,
          output.data<float>(), R, E, E);
  return output;
}

Tensor MultiHeadAttentionModule::backward(const Tensor& gradOutput) {
  if (gpuInput_.defined()) return backwardGpu(gradOutput);
  checkBackward(input_, gradOutput, input_.shape());
  const int64_t N = input_.size(0), T = input_.size(1), E = embed_, H = heads_, dh = E / H, R = N * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const float* g = gradOutput.data<float>();
  // out_proj: its parameters' gradients, and the heads' outputs' gradient.
  projectBackward(attn_.data<float>(), g, outWeight_.value.data<float>(), outWeight_.grad.data<float>(),
                  bias_ ? outBias_.grad.data<float>() : nullptr, R, E, E);
  Tensor dattn = Tensor::empty({R, E});
  blas::sgemm(false, false, R, E, E, 1.0f, g, E, outWeight_.value.data<float>(), E, 0.0f, dattn.data<float>(), E);
  Tensor dqkv = Tensor::empty({R, 3 * E});
  const float* qkv = qkv_.data<float>();
  parallelFor(N * H, 1, [&](int64_t first, int64_t last) {
    std::vector<float> dp(static_cast<size_t>(T * T)), dropped(mask_.defined() ? static_cast<size_t>(T * T) : 0);
    for (int64_t k = first; k < last; ++k) {
      const int64_t n = k / H, h = k % H;
      const float* q = qkv + n * T * 3 * E + h * dh;
      float* dq = dqkv.data<float>() + n * T * 3 * E + h * dh;
      const float* dO = dattn.data<float>() + n * T * E + h * dh;
      const float* p = probs_.data<float>() + (n * H + h) * T * T;
      const float* m = mask_.defined() ? mask_.data<float>() + (n * H + h) * T * T : nullptr;
      const float* weights = p;
      if (m) {
        for (int64_t i = 0; i < T * T; ++i) dropped[static_cast<size_t>(i)] = p[i] * m[i];
        weights = dropped.data();
      }
      // dV = weights^T dO; dWeights = dO V^T (then through the dropout mask).
      blas::sgemm(true, false, T, dh, T, 1.0f, weights, T, dO, E, 0.0f, dq + 2 * E, 3 * E);
      blas::sgemm(false, true, T, T, dh, 1.0f, dO, E, q + 2 * E, 3 * E, 0.0f, dp.data(), T);
      // dS = P (dP - rowsum(dP P)): the softmax's Jacobian; masked keys have P = 0 and get 0.
      for (int64_t i = 0; i < T; ++i) {
        float* d = dp.data() + i * T;
        const float* pr = p + i * T;
        if (m) {
          for (int64_t j = 0; j < T; ++j) d[j] *= m[i * T + j];
        }
        double dot = 0.0;
        for (int64_t j = 0; j < T; ++j) dot += static_cast<double>(d[j]) * pr[j];
        const float c = static_cast<float>(dot);
        for (int64_t j = 0; j < T; ++j) d[j] = pr[j] * (d[j] - c);
      }
      // dQ = dS K scale; dK = dS^T Q scale.
      blas::sgemm(false, false, T, dh, T, scale, dp.data(), T, q + E, 3 * E, 0.0f, dq, 3 * E);
      blas::sgemm(true, false, T, dh, T, scale, dp.data(), T, q, 3 * E, 0.0f, dq + E, 3 * E);
    }
  });
  projectBackward(input_.data<float>(), dqkv.data<float>(), inWeight_.value.data<float>(), inWeight_.grad.data<float>(),
                  bias_ ? inBias_.grad.data<float>() : nullptr, R, E, 3 * E);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(input_.shape());
  blas::sgemm(false, false, R, E, 3 * E, 1.0f, dqkv.data<float>(), 3 * E, inWeight_.value.data<float>(), E, 0.0f,
              gradInput.data<float>(), E);
  return gradInput;
}

ModuleSpec MultiHeadAttentionModule::spec() const {
  return {typeName(),
          {{"embed_dim", double(embed_)}, {"num_heads", double(heads_)}, {"causal", causal_ ? 1.0 : 0.0},
           {"dropout", dropout_}, {"bias", bias_ ? 1.0 : 0.0}}};
}

std::string MultiHeadAttentionModule::repr() const {
  std::string s = makeString("MultiHeadAttentionModule(", embed_, ", ", heads_);
  if (causal_) s += ", causal=True";
  if (dropout_ > 0.0) s += makeString(", dropout=", dropout_);
  if (!bias_) s += ", bias=False";
  return s + ")";
}

}  // namespace cyxwiz::nn
