// .cyxmodel files: the container of common/binary_io.h around
//   module count | per module: type, attribute count, (key, f64 value)... |
//   tensor count | per tensor: name "<layer>.<param>", dtype, rank, dims, data
// Nothing is executed or unpickled on load: modules are rebuilt from their type names.
#pragma once

#include <memory>
#include <string>

#include "cyxwiz/common/binary_io.h"

namespace cyxwiz::nn {

class SequentialModel;

extern const FileKind kModelFileKind;

void encodeModel(ByteWriter& out, const SequentialModel& model);
std::shared_ptr<SequentialModel> decodeModel(ByteReader& in);
// Copies stored weights into an existing model of the same architecture (checkpoints).
void decodeWeightsInto(ByteReader& in, SequentialModel& model);

void writeModelFile(const std::string& path, const SequentialModel& model);
std::shared_ptr<SequentialModel> readModelFile(const std::string& path);

}  // namespace cyxwiz::nn
