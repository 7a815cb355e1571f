// TrainStep: DistributedDataParallel's training step on one batch (forward, loss, backward, gradient
// averaging, optimizer), adding the batch's loss and correct predictions to running sums that stay on
// the model's device, so a GPU step makes no host read. With cudaGraphs, batches of the first batch's
// size replay a CUDA graph of the step (graphed_step.h); others run eagerly.
// DistributedTrainer runs every training batch through one; Python has it as
// cx.distributed.TrainStep for hand-written loops.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/nn/grad_scaler.h"
#include "cyxwiz/nn/loss.h"

namespace cyxwiz::ddp {

class GraphedStep;

// DistributedTrainingConfig.mixed_precision: "" (None: float32), "bf16" or "fp16"; the autocast type
// (nn/autocast.h), or nullopt for float32. Anything else is refused with the choices.
std::optional<DType> parseMixedPrecision(const std::string& name);

// sums[0] += the batch's loss summed over its rows, sums[1] += its correct rows (class targets
// only); `target` checked and on the output's device.
void addBatchSums(const nn::Loss& loss, const Tensor& output, const Tensor& target, Tensor& sums);

class TrainStep {
 public:
  // `ddp`, `loss` and `optimizer` must outlive this step. With cudaGraphs where the step cannot be
  // captured (GraphedStep::unsupportedReason), a notice names the reason and the steps run eagerly.
  TrainStep(DistributedDataParallel& ddp, std::shared_ptr<nn::Loss> loss, std::shared_ptr<nn::Optimizer> optimizer,
            bool cudaGraphs, std::string who);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Mixed precision from the next step on: forward under autocast(*dtype) (nullopt: float32), and,
  // with a scaler, the loss gradient scaled and the optimizer step taken through it (skipped, with
  // the gradients zeroed, where they hold Inf/NaN; the same on every rank) then scaler->update().
  // On a GPU too; a graphed step stays graphed under autocast alone, and is dropped (with a notice:
  // steps run eagerly) with a GradScaler, whose verdict is read on the host every step.
  void setMixedPrecision(std::optional<DType> dtype, std::shared_ptr<nn::GradScaler> scaler);
  // One step on x (rows, features) float32 and its targets, on the host or the model's device. The
  // targets are checked on the host first (labels in range), so the step itself never reads back.
  void run(const Tensor& x, const Tensor& y);
  // {loss summed over its terms, correct terms, rows, terms} since the last reset (terms: rows, or every
  // position of a sequence loss), read to the host after the last replay (bounded by DISTRIBUTED_TIMEOUT_MS).
  std::vector<double> totals();
  // From totals(): the mean loss per term, and the fraction of correct terms (NaN without rows, and
  // the accuracy for losses without classes).
  double meanLoss();
  double accuracy();
  void reset();
  const nn::Loss& loss() const { return *loss_; }
  const std::shared_ptr<nn::GradScaler>& gradScaler() const { return scaler_; }
  bool graphed() const;  // a graph is (or is about to be) replayed
  int64_t replays() const;

 private:
  void eager(const Tensor& x, const Tensor& y);  // the step itself, on device tensors

  DistributedDataParallel& ddp_;
  std::shared_ptr<nn::Loss> loss_;
  std::shared_ptr<nn::Optimizer> optimizer_;
  std::string who_;
  std::optional<DType> autocast_;
  std::shared_ptr<nn::GradScaler> scaler_;
  Tensor sums_;  // float64 {loss, correct} on the model's device; a captured step writes here on every replay
  double rows_ = 0, terms_ = 0;
  std::unique_ptr<GraphedStep> graph_;
};

}  // namespace cyxwiz::ddp
