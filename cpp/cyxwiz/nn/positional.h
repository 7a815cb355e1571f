// PositionalEncodingModule: adds position information to (N, T, D) embeddings, y = x + pe[:T]. Sinusoidal
// (the Transformer paper's pe[p, 2i] = sin(p / 10000^(2i/D)), pe[p, 2i+1] = cos(...), fixed and not
// stored) or learned (a (max_len, D) parameter "weight", initialised N(0, 0.02^2) as GPT-2's). CPU and
// GPU (the sinusoidal table is built on the host once and moves with the module).
#pragma once

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class PositionalEncodingModule : public Module {
 public:
  PositionalEncodingModule(int64_t maxLen, int64_t dim, bool learned = false);

  std::string typeName() const override { return "PositionalEncodingModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override;
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  void to(const Device& device) override;
  bool canDecode() const override { return true; }
  Tensor decode(const Tensor& input, int64_t position) override;  // + pe[position, position + T), CPU

  int64_t maxLen() const { return maxLen_; }
  int64_t dim() const { return dim_; }
  bool learned() const { return learned_; }

 protected:
  void clearCache() override { inputShape_.clear(); }

 private:
  int64_t maxLen_, dim_;
  bool learned_;
  Parameter weight_;  // learned: the table; sinusoidal: table_ holds it instead
  Tensor table_;      // sinusoidal (max_len, D)
  Shape inputShape_;
};

}  // namespace cyxwiz::nn
