// TransformerEncoderModule: one Transformer encoder block over (N, T, d_model), as
// torch.nn.TransformerEncoderLayer(batch_first=True): self-attention and a feed-forward network
// (linear1, activation, dropout, linear2), each with a residual connection and a LayerNorm, before
// the sublayer (norm_first=True, pre-norm) or after the sum (post-norm). Parameters in torch's order
// and names: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*. The sublayers are this engine's
// modules; the block only wires them. CPU and GPU kernels (those of its sublayers).
#pragma once

#include <memory>

#include "cyxwiz/nn/attention.h"
#include "cyxwiz/nn/dropout.h"
#include "cyxwiz/nn/layernorm.h"
#include "cyxwiz/nn/linear.h"

namespace cyxwiz::nn {

class TransformerEncoderModule : public Module {
 public:
  // activation: "gelu" or "relu".
  TransformerEncoderModule(int64_t dModel, int64_t nhead, int64_t dimFeedforward, double dropout = 0.1,
                           const std::string& activation = "gelu", bool causal = false, bool normFirst = true,
                           double eps = 1e-5);

  std::string typeName() const override { return "TransformerEncoderModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override;
  std::vector<std::pair<std::string, Parameter*>> namedParameters() override;
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override { return attn_->outputShape(input); }
  std::vector<Module*> innerModules() override;  // the sublayers, in forward order
  void setTraining(bool training) override;
  bool canDecode() const override { return causal_; }  // its attention keeps the keys and values
  Tensor decode(const Tensor& input, int64_t position) override;
  void resetDecoding() override;

 protected:
  void clearCache() override;

 private:
  // The sublayers in torch's parameter order, with their names.
  std::vector<std::pair<std::string, Module*>> named() const;
  Tensor feedForward(const Tensor& x);
  Tensor feedForwardBackward(const Tensor& g);

  int64_t dModel_, nhead_, dimFeedforward_;
  double dropout_, eps_;
  std::string activation_;
  bool causal_, normFirst_;
  std::shared_ptr<MultiHeadAttentionModule> attn_;
  std::shared_ptr<LinearModule> linear1_, linear2_;
  std::shared_ptr<Module> act_;
  std::shared_ptr<DropoutModule> drop_, drop1_, drop2_;
  std::shared_ptr<LayerNormModule> norm1_, norm2_;
  bool ran_ = false;  // forward ran since the last backward or cache release
};

}  // namespace cyxwiz::nn
