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

std::shared_ptr<SequentialModel> decodeModel(ByteReader& in) {
  // Read everything first: the reader bounds-checks against the payload, so the layers built below
  // can be checked against the data that is really there before they allocate anything.
  uint32_t count = in.u32();
  if (count > 100000) in.fail(makeString("layer count ", count, " is implausible"));
  std::vector<ModuleSpec> specs(count);
  for (uint32_t i = 0; i < count; ++i) {
    specs[i].type = in.str();
    uint32_t nattrs = in.u32();
    if (nattrs > 64) in.fail(makeString("attribute count ", nattrs, " of layer ", i, " is implausible"));
    for (uint32_t a = 0; a < nattrs; ++a) {
      std::string key = in.str();
      specs[i].attrs[key] = in.f64();
    }
  }
  uint32_t ntensors = in.u32();
  if (ntensors > 2 * count + 1) in.fail(makeString("tensor count ", ntensors, " is implausible for ", count, " layers"));
  std::vector<std::pair<std::string, Tensor>> stored;
  int64_t storedValues = 0;
  for (uint32_t i = 0; i < ntensors; ++i) {
    std::string name = in.str();
    stored.emplace_back(name, in.tensor());
    storedValues += stored.back().second.numel();
  }

  auto model = std::make_shared<SequentialModel>();
  for (uint32_t i = 0; i < count; ++i) {
    try {
      model->add(makeModule(specs[i], storedValues));
    } catch (const InvalidArgument& e) {
      in.fail(makeString("layer ", i, " (", specs[i].type, ") cannot be rebuilt: ", e.what()));
    }
  }
  std::vector<std::pair<std::string, Parameter*>> expected;
  for (size_t i = 0; i < model->size(); ++i) {
    for (Parameter* p : model->at(i)->parameters()) expected.emplace_back(makeString(i, ".", p->name), p);
  }
  if (stored.size() != expected.size()) {
    in.fail(makeString("the architecture has ", expected.size(), " parameter tensors but the file stores ", stored.size()));
  }
  for (size_t k = 0; k < expected.size(); ++k) {
    const auto& [name, param] = expected[k];
    const auto& [storedName, t] = stored[k];
    if (storedName != name) in.fail(makeString("expected tensor '", name, "', found '", storedName, "'"));
    if (t.dtype() != param->value.dtype() || t.shape() != param->value.shape()) {
      in.fail(makeString("tensor '", name, "' is ", dtypeName(t.dtype()), " ", shapeString(t.shape()), ", expected ",
                         dtypeName(param->value.dtype()), " ", shapeString(param->value.shape())));
    }
    param->value.copyFrom(t);
  }
  return model;
}

void decodeWeightsInto(ByteReader& in, SequentialModel& model) {
  std::shared_ptr<SequentialModel> stored = decodeModel(in);
  if (stored->architectureFingerprint() != model.architectureFingerprint()) {
    throw InvalidArgument(makeString("the stored model does not match this one.\nstored:\n", stored->repr(),
                                     "\nthis model:\n", model.repr(), "\nbuild the same architecture before loading"));
  }
  auto dst = model.parameters();
  auto src = stored->parameters();
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
