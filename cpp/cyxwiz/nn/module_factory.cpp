// makeModule and parameterShapes: the one place that maps a stored type name back to a module class.
#include <cmath>
#include <functional>
#include <map>

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/activations.h"
#include "cyxwiz/nn/attention.h"
#include "cyxwiz/nn/batchnorm.h"
#include "cyxwiz/nn/conv2d.h"
#include "cyxwiz/nn/dropout.h"
#include "cyxwiz/nn/embedding.h"
#include "cyxwiz/nn/gelu.h"
#include "cyxwiz/nn/layernorm.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/pool2d.h"
#include "cyxwiz/nn/positional.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/residual.h"
#include "cyxwiz/nn/sigmoid.h"
#include "cyxwiz/nn/softmax.h"
#include "cyxwiz/nn/tanh.h"
#include "cyxwiz/nn/transformer.h"

namespace cyxwiz::nn {

namespace {

double attr(const ModuleSpec& spec, const std::string& key) {
  auto it = spec.attrs.find(key);
  if (it == spec.attrs.end()) throw InvalidArgument(makeString(spec.type, " is missing attribute '", key, "'"));
  return it->second;
}

int64_t intAttr(const ModuleSpec& spec, const std::string& key) {
  double v = attr(spec, key);
  if (!(v >= 0 && v < 1e12) || std::floor(v) != v) throw InvalidArgument(makeString(spec.type, ".", key, "=", v, " is not a valid size"));
  return static_cast<int64_t>(v);
}

// A positive size (kernel, stride, dilation, channel count).
int64_t positiveAttr(const ModuleSpec& spec, const std::string& key) {
  int64_t v = intAttr(spec, key);
  if (v == 0) throw InvalidArgument(makeString(spec.type, ".", key, "=0 must be positive"));
  return v;
}

Pair pairAttr(const ModuleSpec& spec, const std::string& key, bool positive) {
  auto get = positive ? positiveAttr : intAttr;
  return {get(spec, key + "_h"), get(spec, key + "_w")};
}

double optionalAttr(const ModuleSpec& spec, const std::string& key, double fallback) {
  auto it = spec.attrs.find(key);
  return it == spec.attrs.end() ? fallback : it->second;
}

// A layer type as a model file names it: how to build one (from its spec and its child modules), and
// what it will allocate.
struct LayerType {
  std::function<std::shared_ptr<Module>(const ModuleSpec&, std::vector<std::shared_ptr<Module>>)> make;
  std::function<std::vector<ParameterShape>(const ModuleSpec&)> parameters;
};

std::vector<ParameterShape> none(const ModuleSpec&) { return {}; }

// A layer without children: `make` from the spec alone.
template <typename F>
LayerType leaf(F make, std::function<std::vector<ParameterShape>(const ModuleSpec&)> parameters = none) {
  return {[make](const ModuleSpec& s, std::vector<std::shared_ptr<Module>> children) -> std::shared_ptr<Module> {
            if (!children.empty()) throw InvalidArgument(makeString(s.type, " holds no other layers"));
            return make(s);
          },
          std::move(parameters)};
}

std::vector<ParameterShape> batchNormShapes(const ModuleSpec& s) {
  const int64_t c = positiveAttr(s, "num_features");
  return {{"weight", DType::Float32, {c}},
          {"bias", DType::Float32, {c}},
          {"running_mean", DType::Float32, {c}, true},
          {"running_var", DType::Float32, {c}, true},
          {"num_batches_tracked", DType::Int64, {}, true}};
}

// LayerNorm's normalized_shape: attributes dims, dim0, dim1, ...
Shape layerNormShape(const ModuleSpec& s) {
  const int64_t dims = positiveAttr(s, "dims");
  if (dims > 8) throw InvalidArgument(makeString("LayerNormModule: ", dims, " normalised dimensions is not a valid layer"));
  Shape shape;
  int64_t total = 1;
  for (int64_t i = 0; i < dims; ++i) {
    shape.push_back(positiveAttr(s, "dim" + std::to_string(i)));
    total *= shape.back();
    if (total > (int64_t(1) << 32)) throw InvalidArgument("LayerNormModule: normalized_shape is too large");
  }
  return shape;
}

std::shared_ptr<Module> makeBatchNorm(const ModuleSpec& s, int dims) {
  auto bn = std::make_shared<BatchNormModule>(dims, positiveAttr(s, "num_features"), attr(s, "eps"), attr(s, "momentum"));
  bn->setSynchronized(optionalAttr(s, "sync", 0.0) != 0.0);
  return bn;
}

const LayerType& layerType(const ModuleSpec& spec) {
  static const std::map<std::string, LayerType> types = {
      {"LinearModule",
       leaf([](const ModuleSpec& s) {
          return std::make_shared<LinearModule>(intAttr(s, "in_features"), intAttr(s, "out_features"), attr(s, "bias") != 0.0);
        },
        [](const ModuleSpec& s) {
          int64_t in = intAttr(s, "in_features"), out = intAttr(s, "out_features");
          std::vector<ParameterShape> shapes{{"weight", DType::Float32, {out, in}}};
          if (attr(s, "bias") != 0.0) shapes.push_back({"bias", DType::Float32, {out}});
          return shapes;
        })},
      {"Conv2DModule",
       leaf([](const ModuleSpec& s) {
          return std::make_shared<Conv2DModule>(intAttr(s, "in_channels"), intAttr(s, "out_channels"),
                                                pairAttr(s, "kernel", true), pairAttr(s, "stride", true),
                                                pairAttr(s, "padding", false), pairAttr(s, "dilation", true),
                                                positiveAttr(s, "groups"), attr(s, "bias") != 0.0);
        },
        [](const ModuleSpec& s) {
          const int64_t in = positiveAttr(s, "in_channels"), out = positiveAttr(s, "out_channels"),
                        groups = positiveAttr(s, "groups");
          const Pair k = pairAttr(s, "kernel", true);
          if (in % groups || out % groups) throw InvalidArgument(makeString("Conv2DModule: groups=", groups, " must divide the channels"));
          std::vector<ParameterShape> shapes{{"weight", DType::Float32, {out, in / groups, k[0], k[1]}}};
          if (attr(s, "bias") != 0.0) shapes.push_back({"bias", DType::Float32, {out}});
          return shapes;
        })},
      {"MaxPool2DModule", leaf([](const ModuleSpec& s) {
         return std::make_shared<MaxPool2DModule>(pairAttr(s, "pool", true), pairAttr(s, "stride", true), pairAttr(s, "padding", false));
       })},
      {"AvgPool2DModule", leaf([](const ModuleSpec& s) {
         return std::make_shared<AvgPool2DModule>(pairAttr(s, "pool", true), pairAttr(s, "stride", true), pairAttr(s, "padding", false));
       })},
      {"GlobalAvgPool2DModule", leaf([](const ModuleSpec&) { return std::make_shared<GlobalAvgPool2DModule>(); })},
      {"FlattenModule", leaf([](const ModuleSpec&) { return std::make_shared<FlattenModule>(); })},
      {"BatchNorm1DModule", leaf([](const ModuleSpec& s) { return makeBatchNorm(s, 1); }, batchNormShapes)},
      {"BatchNorm2DModule", leaf([](const ModuleSpec& s) { return makeBatchNorm(s, 2); }, batchNormShapes)},
      {"ResidualModule",
       {[](const ModuleSpec& s, std::vector<std::shared_ptr<Module>> children) -> std::shared_ptr<Module> {
          const size_t body = static_cast<size_t>(intAttr(s, "body_layers"));
          if (body + static_cast<size_t>(intAttr(s, "shortcut_layers")) != children.size()) {
            throw InvalidArgument("ResidualModule: the layer counts do not match the layers stored after it");
          }
          return ResidualModule::fromLayers(std::vector<std::shared_ptr<Module>>(children.begin(), children.begin() + body),
                                            std::vector<std::shared_ptr<Module>>(children.begin() + body, children.end()),
                                            false);
        },
        none}},
      {"LayerNormModule",
       leaf([](const ModuleSpec& s) { return std::make_shared<LayerNormModule>(layerNormShape(s), attr(s, "eps")); },
            [](const ModuleSpec& s) {
              const Shape shape = layerNormShape(s);
              return std::vector<ParameterShape>{{"weight", DType::Float32, shape}, {"bias", DType::Float32, shape}};
            })},
      {"EmbeddingModule",
       leaf([](const ModuleSpec& s) {
          return std::make_shared<EmbeddingModule>(positiveAttr(s, "num_embeddings"), positiveAttr(s, "embedding_dim"));
        },
        [](const ModuleSpec& s) {
          return std::vector<ParameterShape>{
              {"weight", DType::Float32, {positiveAttr(s, "num_embeddings"), positiveAttr(s, "embedding_dim")}}};
        })},
      {"PositionalEncodingModule",
       leaf([](const ModuleSpec& s) {
          return std::make_shared<PositionalEncodingModule>(positiveAttr(s, "max_len"), positiveAttr(s, "dim"),
                                                            attr(s, "learned") != 0.0);
        },
        [](const ModuleSpec& s) {
          if (attr(s, "learned") == 0.0) return std::vector<ParameterShape>{};
          return std::vector<ParameterShape>{{"weight", DType::Float32, {positiveAttr(s, "max_len"), positiveAttr(s, "dim")}}};
        })},
      {"MultiHeadAttentionModule",
       leaf([](const ModuleSpec& s) {
          return std::make_shared<MultiHeadAttentionModule>(positiveAttr(s, "embed_dim"), positiveAttr(s, "num_heads"),
                                                            attr(s, "causal") != 0.0, attr(s, "dropout"), attr(s, "bias") != 0.0);
        },
        [](const ModuleSpec& s) {
          const int64_t E = positiveAttr(s, "embed_dim");
          if (E > (int64_t(1) << 20)) throw InvalidArgument("MultiHeadAttentionModule: embed_dim is too large");
          const bool bias = attr(s, "bias") != 0.0;
          std::vector<ParameterShape> shapes{{"in_proj_weight", DType::Float32, {3 * E, E}}};
          if (bias) shapes.push_back({"in_proj_bias", DType::Float32, {3 * E}});
          shapes.push_back({"out_proj.weight", DType::Float32, {E, E}});
          if (bias) shapes.push_back({"out_proj.bias", DType::Float32, {E}});
          return shapes;
        })},
      {"TransformerEncoderModule",
       leaf([](const ModuleSpec& s) {
          return std::make_shared<TransformerEncoderModule>(
              positiveAttr(s, "d_model"), positiveAttr(s, "nhead"), positiveAttr(s, "dim_feedforward"), attr(s, "dropout"),
              attr(s, "gelu") != 0.0 ? "gelu" : "relu", attr(s, "causal") != 0.0, attr(s, "norm_first") != 0.0, attr(s, "eps"));
        },
        [](const ModuleSpec& s) {
          const int64_t d = positiveAttr(s, "d_model"), ff = positiveAttr(s, "dim_feedforward");
          if (d > (int64_t(1) << 20) || ff > (int64_t(1) << 24)) throw InvalidArgument("TransformerEncoderModule: too large");
          return std::vector<ParameterShape>{
              {"self_attn.in_proj_weight", DType::Float32, {3 * d, d}}, {"self_attn.in_proj_bias", DType::Float32, {3 * d}},
              {"self_attn.out_proj.weight", DType::Float32, {d, d}}, {"self_attn.out_proj.bias", DType::Float32, {d}},
              {"linear1.weight", DType::Float32, {ff, d}}, {"linear1.bias", DType::Float32, {ff}},
              {"linear2.weight", DType::Float32, {d, ff}}, {"linear2.bias", DType::Float32, {d}},
              {"norm1.weight", DType::Float32, {d}}, {"norm1.bias", DType::Float32, {d}},
              {"norm2.weight", DType::Float32, {d}}, {"norm2.bias", DType::Float32, {d}}};
        })},
      {"ReLUModule", leaf([](const ModuleSpec&) { return std::make_shared<ReLUModule>(); })},
      {"LeakyReLUModule", leaf([](const ModuleSpec& s) { return std::make_shared<LeakyReLUModule>(attr(s, "negative_slope")); })},
      {"ELUModule", leaf([](const ModuleSpec& s) { return std::make_shared<ELUModule>(attr(s, "alpha")); })},
      {"SwishModule", leaf([](const ModuleSpec&) { return std::make_shared<SwishModule>(); })},
      {"MishModule", leaf([](const ModuleSpec&) { return std::make_shared<MishModule>(); })},
      {"SigmoidModule", leaf([](const ModuleSpec&) { return std::make_shared<SigmoidModule>(); })},
      {"TanhModule", leaf([](const ModuleSpec&) { return std::make_shared<TanhModule>(); })},
      {"GELUModule", leaf([](const ModuleSpec&) { return std::make_shared<GELUModule>(); })},
      {"SoftmaxModule", leaf([](const ModuleSpec&) { return std::make_shared<SoftmaxModule>(); })},
      {"DropoutModule", leaf([](const ModuleSpec& s) { return std::make_shared<DropoutModule>(attr(s, "p")); })},
  };
  auto it = types.find(spec.type);
  if (it == types.end()) throw InvalidArgument(makeString("unknown layer type '", spec.type, "'"));
  return it->second;
}

}  // namespace

std::shared_ptr<Module> makeModule(const ModuleSpec& spec, std::vector<std::shared_ptr<Module>> children) {
  return layerType(spec).make(spec, std::move(children));
}

size_t childCount(const ModuleSpec& spec) {
  if (spec.type != "ResidualModule") return 0;
  return static_cast<size_t>(intAttr(spec, "body_layers") + intAttr(spec, "shortcut_layers"));
}

std::vector<ParameterShape> parameterShapes(const ModuleSpec& spec) { return layerType(spec).parameters(spec); }

}  // namespace cyxwiz::nn
