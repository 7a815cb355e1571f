// .cyxmodel files: the container of common/binary_io.h around
//   module count | per module: type, attribute count, (key, f64 value)... |
//   tensor count | per tensor: name "<layer>.<param>", dtype, rank, dims, data
// Nothing is executed or unpickled on load: modules are rebuilt from their type names, and only after
// the parameters their specs describe (names, dtypes, shapes, so the total value count too) were
// matched one by one against the tensors the file stores: a file cannot make the loader allocate
// more than it holds.
#pragma once

#include <memory>
#include <string>

#include "cyxwiz/common/binary_io.h"

namespace cyxwiz::nn {

class SequentialModel;

extern const FileKind kModelFileKind;

void encodeModel(ByteWriter& out, const SequentialModel& model);
std::shared_ptr<SequentialModel> decodeModel(ByteReader& in);
// Copies the weights of a decoded model into one of the same architecture (checkpoints); throws
// InvalidArgument naming both architectures otherwise.
void copyWeights(const SequentialModel& from, SequentialModel& to);

void writeModelFile(const std::string& path, const SequentialModel& model);
std::shared_ptr<SequentialModel> readModelFile(const std::string& path);

}  // namespace cyxwiz::nn
