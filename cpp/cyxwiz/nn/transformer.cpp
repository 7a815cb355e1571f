#include "cyxwiz/nn/transformer.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/nn/elementwise.h"
#include "cyxwiz/nn/gelu.h"
#include "cyxwiz/nn/relu.h"

namespace cyxwiz::nn {

namespace {

// a + b: a residual connection, or its gradient reaching both terms.
Tensor sum(const Tensor& a, const Tensor& b) {
  if (!a.isCuda()) return zipElements(a, b, [](float x, float y) { return x + y; });
  ops::requireSameDevice(a, b, "TransformerEncoderModule");
  Tensor out = Tensor::empty(a.shape(), DType::Float32, a.device());
  CYX_CUDA(add(a.device().index, a.deviceData<float>(), b.deviceData<float>(), out.deviceData<float>(), a.numel()));
  return out;
}

}  // namespace

TransformerEncoderModule::TransformerEncoderModule(int64_t dModel, int64_t nhead, int64_t dimFeedforward, double dropout,
                                                   const std::string& activation, bool causal, bool normFirst, double eps)
    : dModel_(dModel), nhead_(nhead), dimFeedforward_(dimFeedforward), dropout_(dropout), eps_(eps),
      activation_(activation), causal_(causal), normFirst_(normFirst) {
  CYX_CHECK(activation == "gelu" || activation == "relu", "TransformerEncoderModule: activation='", activation,
            "' is one of 'gelu' or 'relu'");
  CYX_CHECK(dimFeedforward > 0, "TransformerEncoderModule: dim_feedforward=", dimFeedforward, " must be positive");
  // Constructed in torch's order, so that one seed gives the same draws as building torch's layer.
  attn_ = std::make_shared<MultiHeadAttentionModule>(dModel, nhead, causal, dropout);
  linear1_ = std::make_shared<LinearModule>(dModel, dimFeedforward);
  drop_ = std::make_shared<DropoutModule>(dropout);
  linear2_ = std::make_shared<LinearModule>(dimFeedforward, dModel);
  norm1_ = std::make_shared<LayerNormModule>(Shape{dModel}, eps);
  norm2_ = std::make_shared<LayerNormModule>(Shape{dModel}, eps);
  drop1_ = std::make_shared<DropoutModule>(dropout);
  drop2_ = std::make_shared<DropoutModule>(dropout);
  act_ = activation == "gelu" ? std::shared_ptr<Module>(std::make_shared<GELUModule>())
                              : std::shared_ptr<Module>(std::make_shared<ReLUModule>());
}

std::vector<std::pair<std::string, Module*>> TransformerEncoderModule::named() const {
  return {{"self_attn.", attn_.get()}, {"linear1.", linear1_.get()}, {"linear2.", linear2_.get()},
          {"norm1.", norm1_.get()}, {"norm2.", norm2_.get()}};
}

std::vector<Parameter*> TransformerEncoderModule::parameters() {
  std::vector<Parameter*> out;
  for (auto& [prefix, m] : named()) {
    for (Parameter* p : m->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<std::pair<std::string, Parameter*>> TransformerEncoderModule::namedParameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (auto& [prefix, m] : named()) {
    for (auto& [name, p] : m->namedParameters()) out.emplace_back(prefix + name, p);
  }
  return out;
}

std::vector<Module*> TransformerEncoderModule::innerModules() {
  Module* attnDrop = drop1_.get();
  std::vector<Module*> ff = {linear1_.get(), act_.get(), drop_.get(), linear2_.get(), drop2_.get()};
  std::vector<Module*> out;
  if (normFirst_) {
    out = {norm1_.get(), attn_.get(), attnDrop, norm2_.get()};
    out.insert(out.end(), ff.begin(), ff.end());
  } else {
    out = {attn_.get(), attnDrop, norm1_.get()};
    out.insert(out.end(), ff.begin(), ff.end());
    out.push_back(norm2_.get());
  }
  return out;
}

void TransformerEncoderModule::setTraining(bool training) {
  Module::setTraining(training);
  for (Module* m : {static_cast<Module*>(attn_.get()), static_cast<Module*>(drop_.get()),
                    static_cast<Module*>(drop1_.get()), static_cast<Module*>(drop2_.get())}) {
    m->setTraining(training);
  }
}

void TransformerEncoderModule::clearCache() {
  for (Module* m : {static_cast<Module*>(attn_.get()), static_cast<Module*>(linear1_.get()), act_.get(),
                    static_cast<Module*>(drop_.get()), static_cast<Module*>(linear2_.get()),
                    static_cast<Module*>(norm1_.get()), static_cast<Module*>(norm2_.get()),
                    static_cast<Module*>(drop1_.get()), static_cast<Module*>(drop2_.get())}) {
    m->releaseCache();
  }
  ran_ = false;
}

// linear2(dropout(activation(linear1(x)))), then the sublayer's own dropout.
Tensor TransformerEncoderModule::feedForward(const Tensor& x) {
  return drop2_->forward(linear2_->forward(drop_->forward(act_->forward(linear1_->forward(x)))));
}

// One statement a layer: each gradient goes as soon as the next is made (nested calls would keep every
// intermediate until the whole expression ends: two (N, T, dim_feedforward) buffers more at the peak).
Tensor TransformerEncoderModule::feedForwardBackward(const Tensor& gradOutput) {
  Tensor g = drop2_->backward(gradOutput);
  g = linear2_->backward(g);
  g = drop_->backward(g);
  g = act_->backward(g);
  return linear1_->backward(g);
}

Tensor TransformerEncoderModule::forward(const Tensor& input) {
  requireInput(input, repr() + ".forward", 3, "(N, T, d_model)");
  outputShape(input.shape());
  ran_ = true;
  if (normFirst_) {
    const Tensor h = sum(input, drop1_->forward(attn_->forward(norm1_->forward(input))));
    return sum(h, feedForward(norm2_->forward(h)));
  }
  const Tensor h = norm1_->forward(sum(input, drop1_->forward(attn_->forward(input))));
  return norm2_->forward(sum(h, feedForward(h)));
}

// forward's composition with the attention decoding (eval: the dropouts are identities).
Tensor TransformerEncoderModule::decode(const Tensor& input, int64_t position) {
  requireInput(input, repr() + ".decode", 3, "(N, T, d_model)");
  if (normFirst_) {
    const Tensor h = sum(input, drop1_->forward(attn_->decode(norm1_->forward(input), position)));
    return sum(h, feedForward(norm2_->forward(h)));
  }
  const Tensor h = norm1_->forward(sum(input, drop1_->forward(attn_->decode(input, position))));
  return norm2_->forward(sum(h, feedForward(h)));
}

void TransformerEncoderModule::resetDecoding() { attn_->resetDecoding(); }

Tensor TransformerEncoderModule::backward(const Tensor& gradOutput) {
  if (!ran_) throw InvalidArgument(repr() + ".backward called before forward; run forward on the batch first");
  Tensor gx;
  if (normFirst_) {
    // y = h + ff(norm2(h)), h = x + attn(norm1(x)): each sum passes its gradient to both terms.
    const Tensor gh = sum(gradOutput, norm2_->backward(feedForwardBackward(gradOutput)));
    gx = sum(gh, norm1_->backward(attn_->backward(drop1_->backward(gh))));
  } else {
    const Tensor g2 = norm2_->backward(gradOutput);
    const Tensor gh = sum(g2, feedForwardBackward(g2));
    const Tensor g1 = norm1_->backward(gh);
    gx = sum(g1, attn_->backward(drop1_->backward(g1)));
  }
  gradsReady();
  return needInputGrad_ ? gx : Tensor();
}

ModuleSpec TransformerEncoderModule::spec() const {
  return {typeName(),
          {{"d_model", double(dModel_)}, {"nhead", double(nhead_)}, {"dim_feedforward", double(dimFeedforward_)},
           {"dropout", dropout_}, {"gelu", activation_ == "gelu" ? 1.0 : 0.0}, {"causal", causal_ ? 1.0 : 0.0},
           {"norm_first", normFirst_ ? 1.0 : 0.0}, {"eps", eps_}}};
}

std::string TransformerEncoderModule::repr() const {
  return makeString("TransformerEncoderModule(d_model=", dModel_, ", nhead=", nhead_, ", dim_feedforward=", dimFeedforward_,
                    ", dropout=", dropout_, ", activation='", activation_, "'", causal_ ? ", causal=True" : "",
                    normFirst_ ? "" : ", norm_first=False", ")");
}

}  // namespace cyxwiz::nn
