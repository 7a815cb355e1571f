#include "cyxwiz/nn/model_file.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::nn {

const FileKind kModelFileKind{"CYXMODEL", "pycyxwiz model", 1};

void encodeModel(ByteWriter& out, const SequentialModel& model) {
  out.u32(static_cast<uint32_t>(model.size()));
  for (const auto& m : model.modules()) {
    ModuleSpec spec = m->spec();
    out.str(spec.type);
    out.u32(static_cast<uint32_t>(spec.attrs.size()));
    for (const auto& [key, value] : spec.attrs) {
      out.str(key);
      out.f64(value);
    }
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < model.size(); ++i) {
    for (Parameter* p : model.at(i)->parameters()) tensors.emplace_back(makeString(i, ".", p->name), p->value);
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

// Every parameter the layers will hold, from their specs alone, matched against the stored tensors:
// same count, and per tensor the same name, dtype and shape (so the same total value count), before
// a single layer allocates anything.
void matchStoredTensors(ByteReader& in, const std::vector<ModuleSpec>& specs,
                        const std::vector<std::pair<std::string, Tensor>>& stored) {
  std::vector<ParameterShape> expected;
  int64_t expectedValues = 0, storedValues = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<ParameterShape> shapes;
    try {
      shapes = parameterShapes(specs[i]);
    } catch (const InvalidArgument& e) {
      in.fail(makeString("layer ", i, " (", specs[i].type, ") cannot be rebuilt: ", e.what()));
    }
    for (ParameterShape& p : shapes) {
      int64_t n = boundedNumel(p.shape);
      if (n < 0 || expectedValues > (int64_t(1) << 62) - n) {
        in.fail(makeString("layer ", i, " (", specs[i].type, ") describes more parameters than any file can hold"));
      }
      expectedValues += n;
      p.name = makeString(i, ".", p.name);
      expected.push_back(std::move(p));
    }
  }
  for (const auto& [name, t] : stored) storedValues += t.numel();
  if (expected.size() != stored.size() || expectedValues != storedValues) {
    in.fail(makeString("the layers hold ", expected.size(), " parameter tensors of ", expectedValues,
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

}  // namespace

std::shared_ptr<SequentialModel> decodeModel(ByteReader& in) {
  // Read everything first: the reader bounds-checks every length against the bytes left, so what is
  // held below is at most what the file stores.
  uint32_t count = in.count("layer count", 8, 100000);  // a layer is at least a type name and an attribute count
  std::vector<ModuleSpec> specs(count);
  for (uint32_t i = 0; i < count; ++i) {
    specs[i].type = in.str();
    uint32_t nattrs = in.count(makeString("attribute count of layer ", i), 12, 64);
    for (uint32_t a = 0; a < nattrs; ++a) {
      std::string key = in.str();
      specs[i].attrs[key] = in.f64();
    }
  }
  uint32_t ntensors = in.u32();
  if (ntensors > 2 * count + 1) in.fail(makeString("tensor count ", ntensors, " is implausible for ", count, " layers"));
  std::vector<std::pair<std::string, Tensor>> stored;
  for (uint32_t i = 0; i < ntensors; ++i) {
    std::string name = in.str();
    stored.emplace_back(name, in.tensor());
  }
  matchStoredTensors(in, specs, stored);

  auto model = std::make_shared<SequentialModel>();
  for (uint32_t i = 0; i < count; ++i) {
    try {
      model->add(makeModule(specs[i]));
    } catch (const InvalidArgument& e) {
      in.fail(makeString("layer ", i, " (", specs[i].type, ") cannot be rebuilt: ", e.what()));
    }
  }
  std::vector<Parameter*> params = model->parameters();
  CYX_CHECK(params.size() == stored.size(), "model file: the layers built ", params.size(),
            " parameters where parameterShapes promised ", stored.size());
  for (size_t k = 0; k < params.size(); ++k) params[k]->value.copyFrom(stored[k].second);
  return model;
}

void copyWeights(const SequentialModel& from, SequentialModel& to) {
  if (from.architectureFingerprint() != to.architectureFingerprint()) {
    throw InvalidArgument(makeString("the stored model does not match this one.\nstored:\n", from.repr(),
                                     "\nthis model:\n", to.repr(), "\nbuild the same architecture before loading"));
  }
  auto dst = to.parameters();
  auto src = from.parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i]->value.copyFrom(src[i]->value);
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
