// .cyxmodel files: the container of common/binary_io.h around
//   module count | per module: type, attribute count, (key, f64 value)..., then the modules it holds
//   (ResidualModule: body and shortcut layers, depth first) |
//   tensor count | per tensor: name "<layer>.<param>" ("3.body.0.weight", "1.running_mean"), dtype,
//   rank, dims, data; layer by layer, its parameters then its buffers
// Nothing is executed or unpickled on load: modules are rebuilt from their type names, and only after
// the parameters their specs describe (names, dtypes, shapes, so the total value count too) were
// matched one by one against the tensors the file stores: a file cannot make the loader allocate
// more than it holds.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/common/binary_io.h"

namespace cyxwiz::nn {

class SequentialModel;

extern const FileKind kModelFileKind;

void encodeModel(ByteWriter& out, const SequentialModel& model);
// What a model file stores, in its order: layer by layer, the parameters' values then the buffers.
std::vector<Tensor*> stateTensors(const SequentialModel& model);
std::shared_ptr<SequentialModel> decodeModel(ByteReader& in);
// Copies the weights of a decoded model into one of the same architecture (checkpoints); throws
// InvalidArgument naming both architectures otherwise.
void copyWeights(const SequentialModel& from, SequentialModel& to);

void writeModelFile(const std::string& path, const SequentialModel& model);
std::shared_ptr<SequentialModel> readModelFile(const std::string& path);

}  // namespace cyxwiz::nn
