// DistributedTrainer: fit / evaluate / predict / checkpoints on top of DistributedDataParallel.
//
// fit shards the training rows with DistributedSampler (seed + epoch), runs forward, loss, DDP
// backward and the optimizer step batch by batch, and reduces loss, accuracy and counts across ranks
// at the end of each epoch, so every rank records the same history. Evaluation and prediction split
// the rows without padding, so each sample counts exactly once. Only rank 0 reports progress; only
// rank 0 writes checkpoints (unless saveOnMasterOnly is off), atomically, and every checkpoint write
// ends in an exchange that doubles as the barrier and tells every rank whether the write worked.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/ddp/history.h"
#include "cyxwiz/nn/grad_scaler.h"
#include "cyxwiz/nn/loss.h"

namespace cyxwiz::ddp {

struct TrainingConfig {
  int64_t epochs = 10;
  int64_t batchSize = 32;  // per rank
  bool shuffle = true;
  uint64_t seed = 42;
  bool dropLast = false;
  bool verbose = true;
  int64_t logEveryNBatches = 10;
  int64_t checkpointEveryNEpochs = 0;  // 0: never
  std::string checkpointDir = "./checkpoints";
  bool saveOnMasterOnly = true;
  double validationSplit = 0.0;        // the last fraction of the rows, held out before sharding
  std::string resumeFromCheckpoint;    // "", "latest" (newest in checkpointDir, if any) or a path
  bool cudaGraphs = false;             // replay each full batch's step as a CUDA graph (GPU models)
  // "" (float32), "bf16" or "fp16": forward under autocast (nn/autocast.h); fp16 with the trainer's
  // GradScaler, whose scale checkpoints keep. Every rank must use the same. CPU models only.
  std::string mixedPrecision;
};

// What rank 0 reports while training; pycyxwiz renders it (progress bar or log lines).
struct ProgressEvent {
  enum class Kind { EpochBegin, Batch, EpochEnd, Message };
  Kind kind = Kind::Message;
  int64_t epoch = 0, epochs = 0;      // epoch counts from 1
  int64_t batch = 0, batches = 0;     // batch counts from 1
  double loss = 0, accuracy = 0;      // Batch: rank 0's running mean; EpochEnd: reduced over ranks
  bool hasAccuracy = true;
  bool hasValidation = false;
  double valLoss = 0, valAccuracy = 0;
  double samplesPerSecond = 0;        // global
  double seconds = 0;                 // since the epoch began
  std::string text;                   // Message
};
using ProgressCallback = std::function<void(const ProgressEvent&)>;

class TrainStep;

class DistributedTrainer {
 public:
  DistributedTrainer(std::shared_ptr<nn::SequentialModel> model, std::shared_ptr<nn::Loss> loss,
                     std::shared_ptr<nn::Optimizer> optimizer, const DDPConfig& ddpConfig = {});
  ~DistributedTrainer();

  TrainingHistory fit(const Tensor& X, const Tensor& y, const TrainingConfig& config);
  TrainingHistory fit(const Tensor& X, const Tensor& y, const Tensor& Xval, const Tensor& yval,
                      const TrainingConfig& config);
  std::pair<double, double> evaluate(const Tensor& X, const Tensor& y, int64_t batchSize = 256);
  Tensor predict(const Tensor& X, int64_t batchSize = 256);

  void saveCheckpoint(const std::string& path);
  void loadCheckpoint(const std::string& path);

  void setProgress(ProgressCallback callback) { progress_ = std::move(callback); }
  int rank() const { return ddp_->rank(); }
  int worldSize() const { return ddp_->worldSize(); }
  bool isMaster() const { return ddp_->isMaster(); }
  const std::shared_ptr<nn::SequentialModel>& model() const { return model_; }
  const nn::Loss& lossFunction() const { return *loss_; }
  DistributedDataParallel& ddp() { return *ddp_; }
  // The loss scaler of mixed_precision="fp16": made by the first such fit (defaults) unless set
  // before; kept across fits and in checkpoints. Null until then.
  const std::shared_ptr<nn::GradScaler>& gradScaler() const { return scaler_; }
  void setGradScaler(std::shared_ptr<nn::GradScaler> scaler) { scaler_ = std::move(scaler); }

 private:

  TrainingHistory run(const Tensor& X, const Tensor& y, std::optional<std::pair<Tensor, Tensor>> validation,
                      const TrainingConfig& config);
  // Every rank must pass the same data shape; InvalidArgument on every rank otherwise.
  void checkSameData(const char* who, const Tensor& X, const Tensor* y, const Tensor* Xval);
  void trainEpoch(const Tensor& X, const Tensor& y, class DistributedBatchIterator& batches, int64_t epoch,
                  const TrainingConfig& config, TrainStep& step);
  // Writes `path` on the writing ranks, then tells every rank whether every write worked.
  void writeCheckpoint(const std::string& path, bool everyRankWrites);
  void resume(const TrainingConfig& config);
  void report(const ProgressEvent& event, bool verbose) const;
  // Every rank must train with the same mixed_precision; InvalidArgument naming the ranks otherwise.
  void checkSameMixedPrecision(const std::string& name);

  std::shared_ptr<nn::SequentialModel> model_;
  std::shared_ptr<nn::Loss> loss_;
  std::shared_ptr<nn::Optimizer> optimizer_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::shared_ptr<nn::GradScaler> scaler_;
  std::string mixedPrecision_;  // of the current (or last) fit, for checkpoints
  ProgressCallback progress_;
  int64_t epochsDone_ = 0;   // of the current (or last) training run
  TrainingHistory done_;     // its history so far
  bool loaded_ = false;      // a checkpoint was loaded for the next fit to continue
};

}  // namespace cyxwiz::ddp
