// MultiHeadAttentionModule: self-attention over (N, T, E), as torch.nn.MultiheadAttention(E, H,
// batch_first=True) called with query = key = value = x: parameters in_proj_weight (3E, E),
// in_proj_bias (3E), out_proj.weight (E, E), out_proj.bias (E), in torch's order and names.
//
// Per sample and head: S = Q K^T / sqrt(E / H), causal positions (key after query) masked to -inf,
// P = softmax(S) in float32 (stable), dropout on P in training, O = P V; the heads' O side by side
// go through out_proj. On the CPU the core runs blocked (attention_cpu.h): forward keeps one log-sum-exp
// per query, not the (N, H, T, T) weights, and backward recomputes them; under autocast the projections
// take 16-bit operands. On a GPU (attention_gpu.cpp) the products are cuBLAS strided batched GEMMs and
// forward keeps P (N x H x T x T floats); under autocast the projections take 16-bit operands there too.
#pragma once

#include <memory>
#include <vector>

#include "cyxwiz/nn/attention_cpu.h"
#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class DropoutModule;

class MultiHeadAttentionModule : public Module {
 public:
  MultiHeadAttentionModule(int64_t embedDim, int64_t numHeads, bool causal = false, double dropout = 0.0,
                           bool bias = true);

  std::string typeName() const override { return "MultiHeadAttentionModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override;
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  std::vector<Module*> innerModules() override;

  int64_t embedDim() const { return embed_; }
  int64_t numHeads() const { return heads_; }
  bool causal() const { return causal_; }
  // Causal self-attention decodes: the new tokens' queries against the keys and values of every token
  // since resetDecoding(), kept here (N x length x E each, grown by doubling). CPU.
  bool canDecode() const override { return causal_; }
  Tensor decode(const Tensor& input, int64_t position) override;
  void resetDecoding() override;
  double dropout() const { return dropout_; }
  bool hasBias() const { return bias_; }

 protected:
  void clearCache() override {
    input_ = qkv_ = attn_ = lse_ = Tensor();
    clearGpuCache();
  }

 private:
  Tensor backward16(const Tensor& gradOutput);  // after an autocast forward

  int64_t embed_, heads_;
  bool causal_;
  double dropout_;
  bool bias_;
  Parameter inWeight_, inBias_, outWeight_, outBias_;
  // Forward's: the input, the projections (N*T, 3E), the heads' outputs (N*T, E; under autocast the input and
  // the heads' outputs are 16-bit copies, the projections float32 holding 16-bit values), each query's log-sum-exp
  // of its scores (N, H, T), and the dropout it drew (its seed; keep 1 when none applied).
  Tensor input_, qkv_, attn_, lse_;
  attention_cpu::Dropout drop_;
  // decode()'s keys and values: (N, capacity, E) each, the first decoded_ positions filled.
  std::vector<float> keys_, values_;
  int64_t decodedN_ = 0, capacity_ = 0, decoded_ = 0;

  // The GPU path (attention_gpu.cpp): forward dispatches CUDA inputs there, backward follows when the
  // GPU forward ran. Its own caches (the CPU path's may change independently): the input, the
  // projections, the heads' outputs, the weights P and the dropped weights. The weights' dropout runs as
  // a DropoutModule (counter-based masks, a seed the graphed step can rewrite), made at the first GPU
  // forward that drops.
  Tensor forwardGpu(const Tensor& input);
  Tensor backwardGpu(const Tensor& gradOutput);
  void clearGpuCache();
  std::shared_ptr<DropoutModule> gpuDropout_;
  // Under autocast the input and the heads' outputs are 16-bit copies, and the weights' 16-bit copies
  // (cast once a step) are kept for backward's dx.
  Tensor gpuInput_, gpuQkv_, gpuAttn_, gpuProbs_, gpuDropped_, gpuInWeight16_, gpuOutWeight16_;
};

}  // namespace cyxwiz::nn
