#include "cyxwiz/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/attention_cpu.h"
#include "cyxwiz/nn/autocast.h"
#include "cyxwiz/nn/linear16.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/convert16.h"  // roundFloats
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

namespace {

// dw += g^T x, db += column sums of g (dx = g w is the caller's: it may not be needed).
void projectBackward(const float* x, const float* g, float* dw, float* db, int64_t R, int64_t in, int64_t out) {
  blas::sgemm(true, false, out, in, R, 1.0f, g, out, x, in, 1.0f, dw, in);
  if (!db) return;
  for (int64_t r = 0; r < R; ++r) {
    const float* gr = g + r * out;
    for (int64_t j = 0; j < out; ++j) db[j] += gr[j];
  }
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
  outputShape(input.shape());
  const int64_t N = input.size(0), T = input.size(1), E = embed_, H = heads_, R = N * T;
  CYX_CHECK(T > 0, repr(), ".forward: the sequences are empty");
  // Under autocast (autocast.h) the projections take 16-bit operands with float32 accumulation and keep
  // their 16-bit inputs; Q, K and V are rounded to the 16-bit type, as torch's 16-bit projections hand
  // them to attention; the scores, the softmax and P V stay float32.
  const std::optional<DType> half = autocastDtype();
  input_ = half ? narrowActivation(input, *half) : keepForBackward(input);
  qkv_ = Tensor::empty({R, 3 * E});
  const float* inBias = bias_ ? inBias_.value.data<float>() : nullptr;
  if (half) {
    linearForward16(input_.reshape({R, E}), inWeight_.value.data<float>(), inBias, qkv_.data<float>(), 3 * E, false);
    roundFloats(qkv_.data<float>(), qkv_.data<float>(), qkv_.numel(), *half);
  } else {
    attention_cpu::project(input_.data<float>(), inWeight_.value.data<float>(), inBias, qkv_.data<float>(), R, E, 3 * E);
  }
  attn_ = Tensor::empty({R, E});
  lse_ = Tensor::empty({N, H, T});
  drop_ = {};
  if (training_ && dropout_ > 0.0) {  // one draw of the engine's stream: the mask is a function of it
    drop_.keep = static_cast<float>(1.0 - dropout_);
    drop_.seed = globalGenerator()();
  }
  attention_cpu::forward({N, T, E, H, causal_}, drop_, qkv_.data<float>(), attn_.data<float>(), lse_.data<float>());
  Tensor output = Tensor::empty({N, T, E});
  const float* outBias = bias_ ? outBias_.value.data<float>() : nullptr;
  if (half) {
    attn_ = narrowActivation(attn_, *half);  // out_proj's kept input
    linearForward16(attn_, outWeight_.value.data<float>(), outBias, output.data<float>(), E, false);
  } else {
    attention_cpu::project(attn_.data<float>(), outWeight_.value.data<float>(), outBias, output.data<float>(), R, E, E);
  }
  return output;
}

Tensor MultiHeadAttentionModule::backward(const Tensor& gradOutput) {
  if (gpuInput_.defined()) return backwardGpu(gradOutput);
  checkBackward(input_, gradOutput, input_.shape());
  const int64_t N = input_.size(0), T = input_.size(1), E = embed_, H = heads_, R = N * T;
  if (input_.dtype() != DType::Float32) return backward16(gradOutput);
  const float* g = gradOutput.data<float>();
  // out_proj: its parameters' gradients, and the heads' outputs' gradient.
  projectBackward(attn_.data<float>(), g, outWeight_.grad.data<float>(), bias_ ? outBias_.grad.data<float>() : nullptr,
                  R, E, E);
  Tensor dattn = Tensor::empty({R, E});
  blas::sgemm(false, false, R, E, E, 1.0f, g, E, outWeight_.value.data<float>(), E, 0.0f, dattn.data<float>(), E);
  Tensor dqkv = Tensor::empty({R, 3 * E});
  attention_cpu::backward({N, T, E, H, causal_}, drop_, qkv_.data<float>(), lse_.data<float>(), dattn.data<float>(),
                          dqkv.data<float>());
  dattn = Tensor();  // spent: not held while in_proj's gradients are made
  projectBackward(input_.data<float>(), dqkv.data<float>(), inWeight_.grad.data<float>(),
                  bias_ ? inBias_.grad.data<float>() : nullptr, R, E, 3 * E);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(input_.shape());
  blas::sgemm(false, false, R, E, 3 * E, 1.0f, dqkv.data<float>(), 3 * E, inWeight_.value.data<float>(), E, 0.0f,
              gradInput.data<float>(), E);
  return gradInput;
}

// After an autocast forward: the projections' backward as LinearModule's (the incoming gradient rounded to
// the 16-bit type, 16-bit operands, float32 accumulation); the core as in float32, on Q, K, V as forward
// rounded them.
Tensor MultiHeadAttentionModule::backward16(const Tensor& gradOutput) {
  const int64_t N = input_.size(0), T = input_.size(1), E = embed_, H = heads_, R = N * T;
  const DType dtype = input_.dtype();
  const Tensor gr = roundGradient16(gradOutput.reshape({R, E}), dtype);
  linearParamGrads16(attn_, gr, outWeight_.grad.data<float>(), bias_ ? outBias_.grad.data<float>() : nullptr);
  const Tensor dattn = linearInputGrad16(gr, outWeight_.value.data<float>(), E, dtype);
  Tensor dqkv = Tensor::empty({R, 3 * E});
  attention_cpu::backward({N, T, E, H, causal_}, drop_, qkv_.data<float>(), lse_.data<float>(), dattn.data<float>(),
                          dqkv.data<float>());
  const Tensor gq = roundGradient16(dqkv, dtype);
  linearParamGrads16(input_.reshape({R, E}), gq, inWeight_.grad.data<float>(), bias_ ? inBias_.grad.data<float>() : nullptr);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  return linearInputGrad16(gq, inWeight_.value.data<float>(), E, dtype).reshape(input_.shape());
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
