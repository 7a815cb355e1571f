#include "cyxwiz/nn/model_file.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::nn {

const FileKind kModelFileKind{"CYXMODEL", "pycyxwiz model", 1};

namespace {

// A layer's spec, then its children's, depth first (ResidualModule's body and shortcut).
void encodeSpec(ByteWriter& out, const Module& m) {
  ModuleSpec spec = m.spec();
  out.str(spec.type);
  out.u32(static_cast<uint32_t>(spec.attrs.size()));
  for (const auto& [key, value] : spec.attrs) {
    out.str(key);
    out.f64(value);
  }
  for (const auto& child : m.children()) encodeSpec(out, *child);
}

}  // namespace

void encodeModel(ByteWriter& out, const SequentialModel& model) {
  out.u32(static_cast<uint32_t>(model.size()));
  for (const auto& m : model.modules()) encodeSpec(out, *m);
  // Layer by layer, its parameters then its buffers (torch's state_dict order).
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < model.size(); ++i) {
    for (auto& [name, p] : model.at(i)->namedParameters()) tensors.emplace_back(makeString(i, ".", name), p->value);
    for (auto& [name, b] : model.at(i)->namedBuffers()) tensors.emplace_back(makeString(i, ".", name), b->value);
  }
  out.u32(static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    out.str(name);
    out.tensor(t);
  }
}

namespace {

// Values in a tensor of `shape`, or -1 past 2^62 (no stored tensor is that large).
int64_t boundedNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (int64_t(1) << 62) / d) return -1;
    n *= d;
  }
  return n;
}

// A stored layer: its spec and the layers it holds.
struct SpecNode {
  ModuleSpec spec;
  std::vector<SpecNode> children;
};

constexpr size_t kMaxLayers = 100000;  // layers in a file, children included
constexpr int kMaxDepth = 64;          // residual blocks inside residual blocks

SpecNode readSpec(ByteReader& in, size_t& layers, int depth) {
  if (++layers > kMaxLayers || depth > kMaxDepth) in.fail("the layers nest too deep or are too many");
  SpecNode node;
  node.spec.type = in.str();
  uint32_t nattrs = in.count(makeString("attribute count of layer ", layers - 1), 12, 64);
  for (uint32_t a = 0; a < nattrs; ++a) {
    std::string key = in.str();
    node.spec.attrs[key] = in.f64();
  }
  size_t children = 0;
  try {
    children = childCount(node.spec);
  } catch (const InvalidArgument& e) {
    in.fail(makeString("layer ", node.spec.type, " cannot be rebuilt: ", e.what()));
  }
  if (children > kMaxLayers) in.fail("the layers nest too deep or are too many");
  for (size_t c = 0; c < children; ++c) node.children.push_back(readSpec(in, layers, depth + 1));
  return node;
}

// The parameter and buffer tensors a layer will hold, named as encodeModel names them ("body.0." inside).
void expectedTensors(ByteReader& in, const SpecNode& node, const std::string& prefix, std::vector<ParameterShape>& own,
                     std::vector<ParameterShape>& buffers) {
  std::vector<ParameterShape> shapes;
  try {
    shapes = parameterShapes(node.spec);
  } catch (const InvalidArgument& e) {
    in.fail(makeString("layer ", prefix, " (", node.spec.type, ") cannot be rebuilt: ", e.what()));
  }
  // A layer lists its parameters, then its buffers; the buffers of a layer with children come after
  // all of its children's parameters (namedParameters, then namedBuffers).
  for (ParameterShape& p : shapes) {
    p.name = prefix + p.name;
    (p.buffer ? buffers : own).push_back(std::move(p));
  }
  const size_t body = node.spec.type == "ResidualModule" ? static_cast<size_t>(node.spec.attrs.at("body_layers")) : 0;
  for (size_t c = 0; c < node.children.size(); ++c) {
    const std::string child = makeString(prefix, c < body ? "body." : "shortcut.", c < body ? c : c - body, ".");
    expectedTensors(in, node.children[c], child, own, buffers);
  }
}

// Every tensor the layers will hold, from their specs alone, matched against the stored tensors:
// same count, and per tensor the same name, dtype and shape (so the same total value count), before
// a single layer allocates anything.
void matchStoredTensors(ByteReader& in, const std::vector<SpecNode>& specs,
                        const std::vector<std::pair<std::string, Tensor>>& stored) {
  std::vector<ParameterShape> expected;
  int64_t expectedValues = 0, storedValues = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<ParameterShape> own, buffers;
    expectedTensors(in, specs[i], makeString(i, "."), own, buffers);
    own.insert(own.end(), buffers.begin(), buffers.end());
    for (ParameterShape& p : own) {
      int64_t n = boundedNumel(p.shape);
      if (n < 0 || expectedValues > (int64_t(1) << 62) - n) {
        in.fail(makeString("layer ", i, " (", specs[i].spec.type, ") describes more parameters than any file can hold"));
      }
      expectedValues += n;
      expected.push_back(std::move(p));
    }
  }
  for (const auto& [name, t] : stored) storedValues += t.numel();
  if (expected.size() != stored.size() || expectedValues != storedValues) {
    in.fail(makeString("the layers hold ", expected.size(), " parameter tensors (buffers included) of ", expectedValues,
                       " values in all, but the file stores ", stored.size(), " tensors of ", storedValues, " values"));
  }
  for (size_t k = 0; k < expected.size(); ++k) {
    const ParameterShape& want = expected[k];
    const auto& [storedName, t] = stored[k];
    if (storedName != want.name) in.fail(makeString("expected tensor '", want.name, "', found '", storedName, "'"));
    if (t.dtype() != want.dtype || t.shape() != want.shape) {
      in.fail(makeString("tensor '", want.name, "' is ", dtypeName(t.dtype()), " ", shapeString(t.shape()), ", expected ",
                         dtypeName(want.dtype), " ", shapeString(want.shape)));
    }
  }
}

std::shared_ptr<Module> build(ByteReader& in, const SpecNode& node, const std::string& where) {
  std::vector<std::shared_ptr<Module>> children;
  for (size_t c = 0; c < node.children.size(); ++c) children.push_back(build(in, node.children[c], makeString(where, ".", c)));
  try {
    return makeModule(node.spec, std::move(children));
  } catch (const InvalidArgument& e) {
    in.fail(makeString("layer ", where, " (", node.spec.type, ") cannot be rebuilt: ", e.what()));
  }
}

}  // namespace

std::shared_ptr<SequentialModel> decodeModel(ByteReader& in) {
  // Read everything first: the reader bounds-checks every length against the bytes left, so what is
  // held below is at most what the file stores.
  uint32_t count = in.count("layer count", 8, kMaxLayers);  // a layer is at least a type name and an attribute count
  size_t layers = 0;
  std::vector<SpecNode> specs;
  for (uint32_t i = 0; i < count; ++i) specs.push_back(readSpec(in, layers, 0));
  // At most 5 tensors a layer (BatchNorm: weight, bias and three buffers), and each is at least a
  // name length, a dtype, a rank.
  uint32_t ntensors = in.u32();
  if (ntensors > 5 * layers + 1) in.fail(makeString("tensor count ", ntensors, " is implausible for ", layers, " layers"));
  std::vector<std::pair<std::string, Tensor>> stored;
  for (uint32_t i = 0; i < ntensors; ++i) {
    std::string name = in.str();
    stored.emplace_back(name, in.tensor());
  }
  matchStoredTensors(in, specs, stored);

  auto model = std::make_shared<SequentialModel>();
  for (uint32_t i = 0; i < count; ++i) {
    std::shared_ptr<Module> m = build(in, specs[i], std::to_string(i));
    try {
      model->add(m);
    } catch (const InvalidArgument& e) {
      in.fail(makeString("layer ", i, " (", specs[i].spec.type, ") cannot be rebuilt: ", e.what()));
    }
  }
  std::vector<Tensor*> state = stateTensors(*model);
  CYX_CHECK(state.size() == stored.size(), "model file: the layers built ", state.size(),
            " tensors where parameterShapes promised ", stored.size());
  for (size_t k = 0; k < state.size(); ++k) state[k]->copyFrom(stored[k].second);
  return model;
}

std::vector<Tensor*> stateTensors(const SequentialModel& model) {
  std::vector<Tensor*> out;
  for (size_t i = 0; i < model.size(); ++i) {
    for (auto& [name, p] : model.at(i)->namedParameters()) out.push_back(&p->value);
    for (auto& [name, b] : model.at(i)->namedBuffers()) out.push_back(&b->value);
  }
  return out;
}

void copyWeights(const SequentialModel& from, SequentialModel& to) {
  if (from.architectureFingerprint() != to.architectureFingerprint()) {
    throw InvalidArgument(makeString("the stored model does not match this one.\nstored:\n", from.repr(),
                                     "\nthis model:\n", to.repr(), "\nbuild the same architecture before loading"));
  }
  auto dst = stateTensors(to);
  auto src = stateTensors(from);
  for (size_t i = 0; i < dst.size(); ++i) dst[i]->copyFrom(*src[i]);
}

void writeModelFile(const std::string& path, const SequentialModel& model) {
  ByteWriter payload;
  encodeModel(payload, model);
  writeContainer(path, kModelFileKind, payload.bytes());
}

std::shared_ptr<SequentialModel> readModelFile(const std::string& path) {
  std::vector<uint8_t> payload = readContainer(path, kModelFileKind);
  ByteReader in(payload, makeString(kModelFileKind.name, " file '", path, "'"));
  auto model = decodeModel(in);
  if (!in.atEnd()) in.fail("unexpected bytes after the last tensor");
  return model;
}

}  // namespace cyxwiz::nn
