#include "cyxwiz/ddp/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <tuple>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/nn/model_file.h"

namespace cyxwiz::ddp {

// Version 2 appends the mixed-precision section; version 1 files (without it) still load.
const FileKind kCheckpointFileKind{"CYXCKPT1", "pycyxwiz checkpoint", 2};

namespace {

void writeDoubles(ByteWriter& out, const std::vector<double>& v) {
  out.u32(static_cast<uint32_t>(v.size()));
  for (double x : v) out.f64(x);
}

std::vector<double> readDoubles(ByteReader& in) {
  std::vector<double> v(in.count("history length", 8, 10000000));
  for (double& x : v) x = in.f64();
  return v;
}

struct Decoded {
  std::shared_ptr<nn::SequentialModel> model;
  TrainingState state;
};

// Everything in the file, checked, without touching the caller's model.
Decoded decode(const std::vector<uint8_t>& payload, const std::string& what) {
  ByteReader in(payload, what);
  Decoded d;
  d.model = nn::decodeModel(in);
  TrainingState& state = d.state;
  state.optimizerType = in.str();
  uint32_t nscalars = in.count("optimizer scalar count", 12, 1000);
  for (uint32_t i = 0; i < nscalars; ++i) {
    std::string key = in.str();
    state.optimizer.scalars[key] = in.f64();
  }
  uint32_t ntensors = in.count("optimizer buffer count", 13, 100000);
  for (uint32_t i = 0; i < ntensors; ++i) {
    std::string key = in.str();
    state.optimizer.tensors[key] = in.tensor();
  }
  state.epoch = in.i64();
  if (state.epoch < 0) in.fail(makeString("epoch ", state.epoch, " is negative"));
  state.worldSize = static_cast<int>(in.u32());
  uint32_t nrng = in.count("RNG state count", 4, 1000000);
  for (uint32_t i = 0; i < nrng; ++i) state.rngStates.push_back(in.str());
  state.history.trainLosses = readDoubles(in);
  state.history.trainAccuracies = readDoubles(in);
  state.history.valLosses = readDoubles(in);
  state.history.valAccuracies = readDoubles(in);
  if (!in.atEnd()) {  // version 2: mixed precision
    state.mixedPrecision = in.str();
    if (in.u8() != 0) {
      nn::GradScalerState s;
      s.scale = in.f64();
      s.growthFactor = in.f64();
      s.backoffFactor = in.f64();
      s.growthInterval = in.i64();
      s.growthTracker = in.i64();
      if (!(s.scale > 0) || !(s.growthFactor > 1) || !(s.backoffFactor > 0 && s.backoffFactor < 1) ||
          s.growthInterval <= 0 || s.growthTracker < 0) {
        in.fail(makeString("loss scaler state (scale ", s.scale, ", growth_interval ", s.growthInterval,
                           ") is out of range"));
      }
      state.scaler = s;
    }
  }
  if (!in.atEnd()) in.fail("unexpected bytes after the mixed-precision settings");
  return d;
}

}  // namespace

std::vector<uint8_t> encodeCheckpoint(const nn::SequentialModel& model, const TrainingState& state) {
  ByteWriter out;
  nn::encodeModel(out, model);
  out.str(state.optimizerType);
  out.u32(static_cast<uint32_t>(state.optimizer.scalars.size()));
  for (const auto& [key, value] : state.optimizer.scalars) {
    out.str(key);
    out.f64(value);
  }
  out.u32(static_cast<uint32_t>(state.optimizer.tensors.size()));
  for (const auto& [key, tensor] : state.optimizer.tensors) {
    out.str(key);
    out.tensor(tensor);
  }
  out.i64(state.epoch);
  out.u32(static_cast<uint32_t>(state.worldSize));
  out.u32(static_cast<uint32_t>(state.rngStates.size()));
  for (const std::string& s : state.rngStates) out.str(s);
  const TrainingHistory& h = state.history;
  writeDoubles(out, h.trainLosses);
  writeDoubles(out, h.trainAccuracies);
  writeDoubles(out, h.valLosses);
  writeDoubles(out, h.valAccuracies);
  out.str(state.mixedPrecision);
  out.u8(state.scaler ? 1 : 0);
  if (state.scaler) {
    out.f64(state.scaler->scale);
    out.f64(state.scaler->growthFactor);
    out.f64(state.scaler->backoffFactor);
    out.i64(state.scaler->growthInterval);
    out.i64(state.scaler->growthTracker);
  }
  return out.bytes();
}

TrainingState decodeCheckpoint(const std::vector<uint8_t>& payload, const std::string& what, nn::SequentialModel& model) {
  Decoded d = decode(payload, what);
  try {
    nn::copyWeights(*d.model, model);  // last: a file that fails anywhere leaves the model as it was
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(makeString(what, ": ", e.what()));
  }
  return d.state;
}

std::string checkpointFileName(int64_t epoch, int rank) {
  char name[64];
  if (rank < 0) {
    std::snprintf(name, sizeof name, "checkpoint_epoch_%04lld.ckpt", static_cast<long long>(epoch));
  } else {
    std::snprintf(name, sizeof name, "checkpoint_epoch_%04lld.rank%d.ckpt", static_cast<long long>(epoch), rank);
  }
  return name;
}

namespace {

// The checkpoints in `dir` by epoch, newest first; at equal epochs the shared file, then rank 0's own.
std::vector<std::string> checkpointsNewestFirst(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  static const std::regex pattern(R"(checkpoint_epoch_(\d+)(\.rank0)?\.ckpt)");
  std::vector<std::tuple<long long, bool, std::string>> found;  // epoch, shared file, path
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern) || m[1].length() > 15) continue;
    found.emplace_back(std::stoll(m[1].str()), !m[2].matched, entry.path().string());
  }
  // At equal epochs the shared file comes before rank 0's own.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> paths;
  for (const auto& f : found) paths.push_back(std::get<2>(f));
  return paths;
}

}  // namespace

std::string latestCheckpoint(const std::string& dir) {
  std::vector<std::string> candidates = checkpointsNewestFirst(dir);
  std::string problems;
  auto skip = [&](const Error& e) {  // e names the file
    logWarning(makeString(e.what(), "; resume_from_checkpoint=\"latest\" tries the next older checkpoint"));
    problems += makeString("\n  ", e.what());
  };
  for (const std::string& path : candidates) {
    try {
      decode(readContainer(path, kCheckpointFileKind), makeString(kCheckpointFileKind.name, " file '", path, "'"));
      if (!problems.empty()) {
        logWarning(makeString("resume_from_checkpoint=\"latest\": resuming from '", path,
                              "', the newest checkpoint in '", dir, "' that decodes"));
      }
      return path;
    } catch (const FileFormatError& e) {  // damaged
      skip(e);
    } catch (const IoError& e) {  // unreadable
      skip(e);
    }
  }
  if (candidates.empty()) return "";
  throw FileFormatError(makeString("resume_from_checkpoint=\"latest\": none of the ", candidates.size(),
                                   " checkpoints in '", dir, "' decodes:", problems,
                                   "\nrepair or remove them, or leave resume_from_checkpoint empty to start from epoch 1"));
}

}  // namespace cyxwiz::ddp
