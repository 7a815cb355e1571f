// Training checkpoints: the container of common/binary_io.h (magic, version, size, crc32) around
//   model (as in .cyxmodel) | optimizer type, scalars, buffers | epochs done | world size |
//   each rank's RNG state | history so far | mixed precision (version 2: the setting, the loss scaler)
// Everything a resumed run needs to continue bit-identically on the same world size; nothing is
// unpickled or executed on load.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cyxwiz/common/binary_io.h"
#include "cyxwiz/ddp/history.h"
#include "cyxwiz/nn/grad_scaler.h"
#include "cyxwiz/nn/optimizer.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::ddp {

extern const FileKind kCheckpointFileKind;

struct TrainingState {
  int64_t epoch = 0;  // epochs completed
  int worldSize = 1;
  std::string optimizerType;
  nn::OptimizerState optimizer;
  std::vector<std::string> rngStates;  // by rank
  TrainingHistory history;
  std::string mixedPrecision;                   // DistributedTrainingConfig.mixed_precision ("" for None)
  std::optional<nn::GradScalerState> scaler;    // fp16's loss scaler, when one was in use
};

std::vector<uint8_t> encodeCheckpoint(const nn::SequentialModel& model, const TrainingState& state);
// Copies the stored weights into `model`, which must have the stored architecture (InvalidArgument
// naming both otherwise); `what` names the file in errors.
TrainingState decodeCheckpoint(const std::vector<uint8_t>& payload, const std::string& what, nn::SequentialModel& model);

// "checkpoint_epoch_0005.ckpt", or "checkpoint_epoch_0005.rank1.ckpt" when every rank writes its own.
std::string checkpointFileName(int64_t epoch, int rank = -1);
// The newest checkpoint in `dir` that reads and decodes (highest epoch, rank 0's file when ranks wrote
// their own), "" if `dir` holds none. A damaged newer one (a crash, a bad disk) is skipped with a
// warning naming it; FileFormatError listing each one's problem if none decodes.
std::string latestCheckpoint(const std::string& dir);

}  // namespace cyxwiz::ddp
