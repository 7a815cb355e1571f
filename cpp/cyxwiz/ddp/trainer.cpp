#include "cyxwiz/ddp/trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <filesystem>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/comm/exchange.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/ddp/checkpoint.h"
#include "cyxwiz/ddp/rows.h"
#include "cyxwiz/ddp/sampler.h"
#include "cyxwiz/ddp/train_step.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::ddp {

namespace {

using Clock = std::chrono::steady_clock;

ProgressEvent note(std::string text) {
  ProgressEvent e;
  e.text = std::move(text);
  return e;
}

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Evaluation and prediction run the model in eval mode (no dropout) and restore the mode after.
class EvalMode {
 public:
  explicit EvalMode(nn::SequentialModel& model) : model_(model), wasTraining_(model.training()) { model.eval(); }
  ~EvalMode() {
    if (wasTraining_) model_.train();
  }

 private:
  nn::SequentialModel& model_;
  bool wasTraining_;
};

// Rows r, r + R, r + 2R, ...: every row on exactly one rank, no padding.
std::vector<int64_t> strideRows(int64_t rows, int rank, int world) {
  std::vector<int64_t> out;
  for (int64_t i = rank; i < rows; i += world) out.push_back(i);
  return out;
}

void checkConfig(const TrainingConfig& c) {
  CYX_CHECK(c.epochs >= 0, "DistributedTrainingConfig.epochs=", c.epochs, " must be >= 0");
  CYX_CHECK(c.batchSize > 0, "DistributedTrainingConfig.batch_size=", c.batchSize, " must be positive");
  CYX_CHECK(c.logEveryNBatches > 0, "DistributedTrainingConfig.log_every_n_batches=", c.logEveryNBatches,
            " must be positive");
  CYX_CHECK(c.checkpointEveryNEpochs >= 0, "DistributedTrainingConfig.checkpoint_every_n_epochs=",
            c.checkpointEveryNEpochs, " must be >= 0 (0 disables checkpoints)");
  CYX_CHECK(c.validationSplit >= 0.0 && c.validationSplit < 1.0, "DistributedTrainingConfig.validation_split=",
            c.validationSplit, " must be in [0, 1)");
}

}  // namespace

DistributedTrainer::~DistributedTrainer() = default;

DistributedTrainer::DistributedTrainer(std::shared_ptr<nn::SequentialModel> model, std::shared_ptr<nn::Loss> loss,
                                       std::shared_ptr<nn::Optimizer> optimizer, const DDPConfig& ddpConfig)
    : model_(std::move(model)), loss_(std::move(loss)), optimizer_(std::move(optimizer)) {
  CYX_CHECK(model_ && loss_ && optimizer_, "DistributedTrainer: model, loss_fn and optimizer are required");
  ddp_ = std::make_unique<DistributedDataParallel>(model_, ddpConfig);
}

TrainingHistory DistributedTrainer::fit(const Tensor& X, const Tensor& y, const TrainingConfig& config) {
  checkConfig(config);
  checkDataset(X, y, "DistributedTrainer.fit");
  if (config.validationSplit <= 0.0) return run(X, y, std::nullopt, config);
  // As Keras: the last fraction of the rows, before any shuffling or sharding.
  const int64_t rows = X.size(0);
  const int64_t splitAt = static_cast<int64_t>(static_cast<double>(rows) * (1.0 - config.validationSplit));
  CYX_CHECK(splitAt > 0 && splitAt < rows, "DistributedTrainer.fit: validation_split=", config.validationSplit,
            " leaves ", splitAt, " training and ", rows - splitAt, " validation rows of ", rows,
            "; both need at least one");
  return run(rowRange(X, 0, splitAt), rowRange(y, 0, splitAt),
             std::make_pair(rowRange(X, splitAt, rows), rowRange(y, splitAt, rows)), config);
}

TrainingHistory DistributedTrainer::fit(const Tensor& X, const Tensor& y, const Tensor& Xval, const Tensor& yval,
                                        const TrainingConfig& config) {
  checkConfig(config);
  checkDataset(X, y, "DistributedTrainer.fit");
  checkDataset(Xval, yval, "DistributedTrainer.fit (validation data)");
  if (config.validationSplit > 0.0) {
    logNotice("DistributedTrainer.fit: validation_split is ignored because validation data was given");
  }
  return run(X, y, std::make_pair(Xval, yval), config);
}

void DistributedTrainer::checkSameData(const char* who, const Tensor& X, const Tensor* y, const Tensor* Xval) {
  // fit, evaluate and predict are collective and split the rows by number: every rank must hold
  // the same data shape, or the ranks would silently disagree about which rows are whose.
  const double perRow = X.size(0) ? double(X.numel() / X.size(0)) : 0.0;  // the values of one sample
  std::vector<double> mine{double(X.size(0)), perRow, y && y->dim() > 1 ? double(y->size(1)) : 0.0,
                           Xval ? double(Xval->size(0)) : -1.0};
  std::vector<double> all = comm::allGatherDoubles(*ddp_->backend(), mine);
  for (int r = 1; r < worldSize(); ++r) {
    if (std::equal(all.begin(), all.begin() + mine.size(), all.begin() + r * mine.size())) continue;
    auto describe = [&](int k) {
      const double* v = all.data() + k * mine.size();
      return makeString("rank ", k, ": ", v[0], " rows x ", v[1], " values",
                        v[3] >= 0 ? makeString(", ", v[3], " validation rows") : std::string());
    };
    std::string message = makeString(rankPrefix(), "DistributedTrainer.", who, ": the ranks hold different data (");
    for (int k = 0; k < worldSize(); ++k) message += (k ? "; " : "") + describe(k);
    throw InvalidArgument(makeString(message, "). Give every rank the same arrays: ", who,
                                     " splits the rows between the ranks itself"));
  }
}

TrainingHistory DistributedTrainer::run(const Tensor& X, const Tensor& y,
                                        std::optional<std::pair<Tensor, Tensor>> validation,
                                        const TrainingConfig& config) {
  checkSameData("fit", X, &y, validation ? &validation->first : nullptr);
  const std::optional<DType> mixed = parseMixedPrecision(config.mixedPrecision);
  checkSameMixedPrecision(config.mixedPrecision);
  // A fit starts at epoch 1 unless a checkpoint was loaded for it (load_checkpoint or resume).
  if (!config.resumeFromCheckpoint.empty()) resume(config);
  if (!loaded_) {
    epochsDone_ = 0;
    done_ = TrainingHistory{};
  }
  loaded_ = false;
  TrainingHistory history = done_;
  history.worldSize = worldSize();
  history.effectiveBatchSize = config.batchSize * worldSize();
  history.startEpoch = epochsDone_;

  auto sampler = std::make_shared<DistributedSampler>(X.size(0), worldSize(), rank(), config.shuffle, config.seed,
                                                      config.dropLast);
  DistributedBatchIterator batches(sampler, config.batchSize);
  CYX_CHECK(batches.numBatches() > 0, "DistributedTrainer.fit: ", X.size(0), " rows over ", worldSize(),
            " ranks leave no batch (drop_last drops them all); use more data or drop_last=False");

  const auto start = Clock::now();
  double samples = 0.0, trainSeconds = 0.0;
  model_->train();
  // One step for the whole fit: with cuda_graphs its graph is captured once and replayed every epoch.
  TrainStep step(*ddp_, loss_, optimizer_, config.cudaGraphs, "DistributedTrainer.fit");
  mixedPrecision_ = config.mixedPrecision;
  if (mixed == DType::Float16 && !scaler_) scaler_ = std::make_shared<nn::GradScaler>();
  step.setMixedPrecision(mixed, mixed == DType::Float16 ? scaler_ : nullptr);
  for (int64_t epoch = epochsDone_; epoch < config.epochs; ++epoch) {
    const auto epochStart = Clock::now();
    report({ProgressEvent::Kind::EpochBegin, epoch + 1, config.epochs, 0, batches.numBatches()}, config.verbose);
    step.reset();
    trainEpoch(X, y, batches, epoch, config, step);
    // Each rank's last forward moved its BatchNorm statistics by its own rows: rank 0's go everywhere
    // before the epoch is evaluated, checkpointed or returned.
    if (ddp_->config().broadcastBuffers) ddp_->broadcastBuffers();
    std::vector<double> total = comm::allReduceSum(*ddp_->backend(), step.totals());
    const double epochSeconds = secondsSince(epochStart);
    samples += total[2];
    trainSeconds += epochSeconds;

    ProgressEvent end{ProgressEvent::Kind::EpochEnd, epoch + 1, config.epochs, batches.numBatches(), batches.numBatches()};
    end.loss = total[0] / total[3];
    end.hasAccuracy = loss_->takesClassIndices();
    end.accuracy = end.hasAccuracy ? total[1] / total[3] : std::nan("");
    history.trainLosses.push_back(end.loss);
    history.trainAccuracies.push_back(end.accuracy);
    if (validation) {
      auto [valLoss, valAccuracy] = evaluate(validation->first, validation->second);
      end.hasValidation = true;
      end.valLoss = valLoss;
      end.valAccuracy = valAccuracy;
      history.valLosses.push_back(valLoss);
      history.valAccuracies.push_back(valAccuracy);
    }
    end.samplesPerSecond = total[2] / epochSeconds;
    end.seconds = epochSeconds;
    report(end, config.verbose);

    epochsDone_ = epoch + 1;
    done_ = history;
    if (config.checkpointEveryNEpochs > 0 && epochsDone_ % config.checkpointEveryNEpochs == 0) {
      namespace fs = std::filesystem;
      const bool every = !config.saveOnMasterOnly;
      std::string path = (fs::path(config.checkpointDir) / checkpointFileName(epochsDone_, every ? rank() : -1)).string();
      writeCheckpoint(path, every);
      report(note("checkpoint saved: " + path), config.verbose);
    }
  }
  history.totalTimeSeconds = secondsSince(start);
  history.samplesPerSecond = trainSeconds > 0 ? samples / trainSeconds : 0.0;
  return history;
}

void DistributedTrainer::trainEpoch(const Tensor& X, const Tensor& y, DistributedBatchIterator& batches, int64_t epoch,
                                    const TrainingConfig& config, TrainStep& step) {
  batches.reset(epoch);
  const int64_t count = batches.numBatches();
  const auto start = Clock::now();
  for (int64_t b = 0; batches.hasNext(); ++b) {
    std::vector<int64_t> rows = batches.next();
    step.run(gatherRows(X, rows), gatherRows(y, rows));
    if (config.verbose && isMaster() && ((b + 1) % config.logEveryNBatches == 0 || b + 1 == count)) {
      ProgressEvent e{ProgressEvent::Kind::Batch, epoch + 1, config.epochs, b + 1, count};
      const std::vector<double> local = step.totals();
      e.loss = local[0] / local[3];
      e.hasAccuracy = loss_->takesClassIndices();
      e.accuracy = local[1] / local[3];
      e.seconds = secondsSince(start);
      e.samplesPerSecond = local[2] * worldSize() / std::max(e.seconds, 1e-9);  // every rank runs the same batches
      report(e, true);
    }
    comm::throwIfInterrupted("DistributedTrainer.fit");
  }
}

std::pair<double, double> DistributedTrainer::evaluate(const Tensor& X, const Tensor& y, int64_t batchSize) {
  checkDataset(X, y, "DistributedTrainer.evaluate");
  CYX_CHECK(batchSize > 0, "DistributedTrainer.evaluate: batch_size=", batchSize, " must be positive");
  checkSameData("evaluate", X, &y, nullptr);
  EvalMode guard(*model_);
  std::vector<int64_t> mine = strideRows(X.size(0), rank(), worldSize());
  Tensor sums = Tensor::zeros({2}, DType::Float64, model_->device());  // {loss, correct}, read once at the end
  double count = 0;
  for (size_t begin = 0; begin < mine.size(); begin += static_cast<size_t>(batchSize)) {
    std::vector<int64_t> rows(mine.begin() + begin, mine.begin() + std::min(mine.size(), begin + batchSize));
    Tensor out = model_->forward(gatherRows(X, rows));
    const Tensor target = gatherRows(y, rows);
    addBatchSums(*loss_, out, loss_->prepareTarget(out, target, "DistributedTrainer.evaluate"), sums);
    count += static_cast<double>(loss_->terms(out.shape(), target));
  }
  const Tensor local = sums.to(Device{});
  std::vector<double> total =
      comm::allReduceSum(*ddp_->backend(), {local.data<double>()[0], local.data<double>()[1], count});
  const double accuracy = loss_->takesClassIndices() ? total[1] / total[2] : std::nan("");
  return {total[0] / total[2], accuracy};
}

Tensor DistributedTrainer::predict(const Tensor& X, int64_t batchSize) {
  CYX_CHECK(X.dim() >= 2 && X.dtype() == DType::Float32, "DistributedTrainer.predict: X must be a float32 array of "
            "samples (2 or more dimensions), got ", dtypeName(X.dtype()), " ", shapeString(X.shape()));
  CYX_CHECK(batchSize > 0, "DistributedTrainer.predict: batch_size=", batchSize, " must be positive");
  checkSameData("predict", X, nullptr, nullptr);
  EvalMode guard(*model_);
  Shape outShape = model_->outputShape(X.shape());  // (rows, ...): each block holds perRank of them
  const int64_t rows = X.size(0), world = worldSize();
  const int64_t perRank = (rows + world - 1) / world;
  // Each rank predicts its strided rows into a block of perRank rows; one all-gather puts the blocks
  // side by side, and row i is row i / world of block i % world.
  outShape[0] = perRank;
  Tensor block = Tensor::zeros(outShape);
  std::vector<int64_t> mine = strideRows(rows, rank(), static_cast<int>(world));
  for (size_t begin = 0; begin < mine.size(); begin += static_cast<size_t>(batchSize)) {
    std::vector<int64_t> batch(mine.begin() + begin, mine.begin() + std::min(mine.size(), begin + batchSize));
    Tensor out = model_->forward(gatherRows(X, batch));
    rowRange(block, static_cast<int64_t>(begin), static_cast<int64_t>(begin + batch.size())).copyFrom(out);
  }
  outShape[0] = world * perRank;
  Tensor gathered = Tensor::empty(outShape);
  ddp_->backend()->allGather(block, gathered, false)->wait();
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) order[i] = (i % world) * perRank + i / world;
  return gatherRows(gathered, order);
}

void DistributedTrainer::checkSameMixedPrecision(const std::string& name) {
  const std::string mine = name.empty() ? "None" : "'" + name + "'";
  const std::vector<std::string> all = comm::allGatherStrings(*ddp_->backend(), mine);
  if (std::all_of(all.begin(), all.end(), [&](const std::string& s) { return s == all[0]; })) return;
  std::string message = makeString(rankPrefix(), "DistributedTrainer.fit: the ranks train with different "
                                   "mixed_precision settings; every rank must use the same:");
  for (size_t r = 0; r < all.size(); ++r) {
    message += makeString("\n  rank ", r, all[r] != all[0] ? " (differs from rank 0)" : "", ": mixed_precision=", all[r]);
  }
  throw InvalidArgument(message);
}

void DistributedTrainer::saveCheckpoint(const std::string& path) { writeCheckpoint(path, false); }

void DistributedTrainer::writeCheckpoint(const std::string& path, bool everyRankWrites) {
  comm::Backend& backend = *ddp_->backend();
  TrainingState state;
  state.epoch = epochsDone_;
  state.worldSize = worldSize();
  state.optimizerType = optimizer_->typeName();
  state.optimizer = ddp_->optimizerState(*optimizer_);  // collective when the step is sharded
  state.rngStates = comm::allGatherStrings(backend, generatorState());
  state.history = done_;
  state.mixedPrecision = mixedPrecision_;
  if (scaler_ && scaler_->enabled()) state.scaler = scaler_->state();
  // "<errno> <message>" when this rank's write failed, "" when it worked or was not this rank's to do.
  std::string error;
  if (everyRankWrites || isMaster()) {
    try {
      std::filesystem::path parent = std::filesystem::path(path).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent);
      writeContainer(path, kCheckpointFileKind, encodeCheckpoint(*model_, state));
    } catch (const IoError& e) {
      error = makeString(e.errnoValue(), " ", e.what());
    } catch (const std::filesystem::filesystem_error& e) {
      error = makeString(e.code().value(), " ", e.what());
    } catch (const std::exception& e) {
      error = makeString(EIO, " ", e.what());
    }
  }
  // Doubles as the barrier after the save: no rank goes on before the file is complete.
  std::vector<std::string> errors = comm::allGatherStrings(backend, error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    const size_t space = errors[r].find(' ');
    throw IoError(makeString(rankPrefix(), "save_checkpoint: rank ", r, " could not write '", path, "': ",
                             errors[r].substr(space + 1), "; check that checkpoint_dir is a writable directory"),
                  std::atoi(errors[r].c_str()));
  }
}

void DistributedTrainer::loadCheckpoint(const std::string& path) {
  comm::Backend& backend = *ddp_->backend();
  // Rank 0 reads and sends the bytes: the other ranks need no access to rank 0's file system. The
  // first byte says what happened: 0 the payload follows, 1 a format error, 2 an I/O error (errno next).
  std::vector<uint8_t> message;
  if (isMaster()) {
    try {
      message = readContainer(path, kCheckpointFileKind);
      message.insert(message.begin(), 0);
    } catch (const FileFormatError& e) {
      std::string text = e.what();
      message.assign(text.begin(), text.end());
      message.insert(message.begin(), 1);
    } catch (const IoError& e) {
      std::string text = e.what();
      message.assign(text.begin(), text.end());
      message.insert(message.begin(), static_cast<uint8_t>(e.errnoValue()));
      message.insert(message.begin(), 2);
    }
  }
  message = comm::broadcastBytes(backend, message, 0);
  if (message.at(0) == 1) throw FileFormatError(std::string(message.begin() + 1, message.end()));
  if (message.at(0) == 2) throw IoError(std::string(message.begin() + 2, message.end()), message.at(1));
  message.erase(message.begin());

  TrainingState state = decodeCheckpoint(message, makeString(kCheckpointFileKind.name, " file '", path, "'"), *model_);
  CYX_CHECK(state.optimizerType == optimizer_->typeName(), rankPrefix(), "load_checkpoint: '", path, "' holds optimizer state of type ",
            state.optimizerType, " but this trainer's optimizer is ", optimizer_->typeName(), "; use the same optimizer type");
  optimizer_->loadState(state.optimizer);
  if (state.scaler) {  // the loss scale of an fp16 run goes on where it was
    if (!scaler_) scaler_ = std::make_shared<nn::GradScaler>();
    scaler_->loadState(*state.scaler);
  }
  epochsDone_ = state.epoch;
  done_ = state.history;
  loaded_ = true;
  if (state.worldSize == worldSize() && static_cast<int>(state.rngStates.size()) == worldSize()) {
    setGeneratorState(state.rngStates[rank()]);
  } else {
    logInfo(makeString("load_checkpoint: '", path, "' was written by ", state.worldSize, " ranks and this job has ",
                       worldSize(), ": the random stream (dropout) is not restored, so training goes on well but not "
                       "bit-identically"));
  }
}

void DistributedTrainer::resume(const TrainingConfig& config) {
  std::string path = config.resumeFromCheckpoint;
  if (path == "latest") {
    // Rank 0 decides, so that every rank loads the same epoch even if their directories differ. The
    // first byte says what follows: 0 the path ("" for none), 1 why no checkpoint decodes.
    std::string found;
    uint8_t status = 0;
    if (isMaster()) {
      try {
        found = latestCheckpoint(config.checkpointDir);
      } catch (const FileFormatError& e) {
        found = e.what();
        status = 1;
      }
    }
    found.insert(found.begin(), char(status));
    std::vector<uint8_t> bytes = comm::broadcastBytes(*ddp_->backend(), std::vector<uint8_t>(found.begin(), found.end()), 0);
    path.assign(bytes.begin() + 1, bytes.end());
    if (bytes.at(0) == 1) throw FileFormatError(path);
    if (path.empty()) {
      report(note("no checkpoint in " + config.checkpointDir + ": starting from epoch 1"), config.verbose);
      return;
    }
  }
  loadCheckpoint(path);
  report(note(makeString("resumed from ", path, " after epoch ", epochsDone_)), config.verbose);
}

void DistributedTrainer::report(const ProgressEvent& event, bool verbose) const {
  if (verbose && isMaster() && progress_) progress_(event);
}

}  // namespace cyxwiz::ddp
