// makeModule: the one place that maps a stored type name back to a module class.
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

}  // namespace

std::shared_ptr<Module> makeModule(const ModuleSpec& spec, int64_t maxParameters) {
  using Maker = std::function<std::shared_ptr<Module>(const ModuleSpec&, int64_t)>;
  static const std::map<std::string, Maker> makers = {
      {"LinearModule", [](const ModuleSpec& s, int64_t budget) {
         int64_t in = intAttr(s, "in_features"), out = intAttr(s, "out_features");
         bool bias = attr(s, "bias") != 0.0;
         if (budget >= 0 && (in > budget || out > budget || in * out + (bias ? out : 0) > budget)) {
           throw InvalidArgument(makeString("LinearModule(", in, ", ", out, ") needs more parameters than the file stores (", budget, ")"));
         }
         return std::make_shared<LinearModule>(in, out, bias);
       }},
      {"ReLUModule", [](const ModuleSpec&, int64_t) { return std::make_shared<ReLUModule>(); }},
      {"SigmoidModule", [](const ModuleSpec&, int64_t) { return std::make_shared<SigmoidModule>(); }},
      {"TanhModule", [](const ModuleSpec&, int64_t) { return std::make_shared<TanhModule>(); }},
      {"GELUModule", [](const ModuleSpec&, int64_t) { return std::make_shared<GELUModule>(); }},
      {"SoftmaxModule", [](const ModuleSpec&, int64_t) { return std::make_shared<SoftmaxModule>(); }},
      {"DropoutModule", [](const ModuleSpec& s, int64_t) { return std::make_shared<DropoutModule>(attr(s, "p")); }},
  };
  auto it = makers.find(spec.type);
  if (it == makers.end()) throw InvalidArgument(makeString("unknown layer type '", spec.type, "'"));
  return it->second(spec, maxParameters);
}

}  // namespace cyxwiz::nn
