// makeModule and parameterShapes: the one place that maps a stored type name back to a module class.
#include <cmath>
#include <functional>
#include <map>

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/dropout.h"
#include "cyxwiz/nn/gelu.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/sigmoid.h"
#include "cyxwiz/nn/softmax.h"
#include "cyxwiz/nn/tanh.h"

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

// A layer type as a model file names it: how to build one, and what it will allocate.
struct LayerType {
  std::function<std::shared_ptr<Module>(const ModuleSpec&)> make;
  std::function<std::vector<ParameterShape>(const ModuleSpec&)> parameters;
};

std::vector<ParameterShape> none(const ModuleSpec&) { return {}; }

const LayerType& layerType(const ModuleSpec& spec) {
  static const std::map<std::string, LayerType> types = {
      {"LinearModule",
       {[](const ModuleSpec& s) {
          return std::make_shared<LinearModule>(intAttr(s, "in_features"), intAttr(s, "out_features"), attr(s, "bias") != 0.0);
        },
        [](const ModuleSpec& s) {
          int64_t in = intAttr(s, "in_features"), out = intAttr(s, "out_features");
          std::vector<ParameterShape> shapes{{"weight", DType::Float32, {out, in}}};
          if (attr(s, "bias") != 0.0) shapes.push_back({"bias", DType::Float32, {out}});
          return shapes;
        }}},
      {"ReLUModule", {[](const ModuleSpec&) { return std::make_shared<ReLUModule>(); }, none}},
      {"SigmoidModule", {[](const ModuleSpec&) { return std::make_shared<SigmoidModule>(); }, none}},
      {"TanhModule", {[](const ModuleSpec&) { return std::make_shared<TanhModule>(); }, none}},
      {"GELUModule", {[](const ModuleSpec&) { return std::make_shared<GELUModule>(); }, none}},
      {"SoftmaxModule", {[](const ModuleSpec&) { return std::make_shared<SoftmaxModule>(); }, none}},
      {"DropoutModule", {[](const ModuleSpec& s) { return std::make_shared<DropoutModule>(attr(s, "p")); }, none}},
  };
  auto it = types.find(spec.type);
  if (it == types.end()) throw InvalidArgument(makeString("unknown layer type '", spec.type, "'"));
  return it->second;
}

}  // namespace

std::shared_ptr<Module> makeModule(const ModuleSpec& spec) { return layerType(spec).make(spec); }

std::vector<ParameterShape> parameterShapes(const ModuleSpec& spec) { return layerType(spec).parameters(spec); }

}  // namespace cyxwiz::nn
