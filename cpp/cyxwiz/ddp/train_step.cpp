#include "cyxwiz/ddp/train_step.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/ddp/graphed_step.h"
#include "cyxwiz/ddp/scaled_gradients.h"
#include "cyxwiz/nn/autocast.h"

namespace cyxwiz::ddp {

void addBatchSums(const nn::Loss& loss, const Tensor& output, const Tensor& target, Tensor& sums) {
  loss.addLossSum(output, target, sums, 0);
  if (loss.takesClassIndices()) nn::addCorrectCount(output, target, sums, 1, loss.ignoreIndex());
}

std::optional<DType> parseMixedPrecision(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "bf16") return DType::BFloat16;
  if (name == "fp16") return DType::Float16;
  throw InvalidArgument(makeString("mixed_precision='", name, "': use None (float32, the default), 'bf16' or 'fp16' "
                                   "(float16 with dynamic loss scaling)"));
}

TrainStep::TrainStep(DistributedDataParallel& ddp, std::shared_ptr<nn::Loss> loss,
                     std::shared_ptr<nn::Optimizer> optimizer, bool cudaGraphs, std::string who)
    : ddp_(ddp),
      loss_(std::move(loss)),
      optimizer_(std::move(optimizer)),
      who_(std::move(who)),
      sums_(Tensor::zeros({2}, DType::Float64, ddp.model()->device())) {
  if (!cudaGraphs) return;
  const std::string why = GraphedStep::unsupportedReason(ddp_);
  if (!why.empty()) {
    logNotice(who_ + ": cuda_graphs=True is ignored because " + why + "; training without graphs");
    return;
  }
  graph_ = std::make_unique<GraphedStep>(ddp_, *optimizer_, [this](const Tensor& x, const Tensor& y) { eager(x, y); });
}

TrainStep::~TrainStep() = default;

void TrainStep::run(const Tensor& x, const Tensor& y) {
  const nn::SequentialModel& model = *ddp_.model();
  if (x.dtype() != DType::Float32 || x.dim() < 2) {
    throw InvalidArgument(makeString(who_, ": expected a float32 batch of at least 2 dimensions (rows first), got ",
                                     dtypeName(x.dtype()), " ", shapeString(x.shape())));
  }
  Shape out;
  try {
    out = model.outputShape(x.shape());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(makeString(who_, ": the batch has shape ", shapeString(x.shape()), ", which this model does not ",
                                     "take (", e.what(), ")"));
  }
  loss_->checkTarget(out, y, who_);
  if (!(graph_ && graph_->fits(x, y) && graph_->run(x, y))) {
    if (graph_) graph_->finish();  // bounded, before copies that could wait on a stuck replay
    eager(x.to(model.device()), y.to(model.device()));
  }
  rows_ += static_cast<double>(x.size(0));
  terms_ += static_cast<double>(loss_->terms(out, y));
}

void TrainStep::setMixedPrecision(std::optional<DType> dtype, std::shared_ptr<nn::GradScaler> scaler) {
  if (scaler && scaler->enabled() && graph_) {
    // The skip-or-step verdict of dynamic loss scaling is read back to the host every step; a graph
    // replays without the host. bf16 needs no loss scaling and keeps the graph.
    if (graph_->replays() > 0) graph_->finish();
    graph_.reset();
    logNotice(who_ + ": cuda_graphs=True is ignored with a GradScaler (mixed_precision='fp16'): its Inf/NaN check "
              "reads the gradients' verdict back to the host at every step, which a CUDA graph cannot contain; use "
              "mixed_precision='bf16' (no loss scaling) to keep the graph; training without graphs");
  }
  autocast_ = dtype;
  scaler_ = std::move(scaler);
}

void TrainStep::eager(const Tensor& x, const Tensor& y) {
  Tensor out;
  {
    std::optional<nn::AutocastGuard> guard;  // none: whatever the caller's thread has (float32 by default)
    if (autocast_) guard.emplace(*autocast_);
    out = ddp_.forward(x);
  }
  addBatchSums(*loss_, out, y, sums_);  // losses in float32, outside autocast
  if (!scaler_) {
    ddp_.backward(loss_->gradient(out, y));
    ddp_.updateParameters(*optimizer_);
    return;
  }
  ddp_.backward(scaler_->scale(loss_->gradient(out, y)));
  DDPGradients gradients(ddp_);
  scaler_->step(*optimizer_, gradients);  // update_parameters, or zeroes the gradients of a skipped step
  scaler_->update();
}

std::vector<double> TrainStep::totals() {
  if (graph_) graph_->finish();  // a replay stuck in a collective fails here, not in the copy below
  const Tensor host = sums_.to(Device{});
  return {host.data<double>()[0], host.data<double>()[1], rows_, terms_};
}

double TrainStep::meanLoss() {
  const std::vector<double> t = totals();
  return t[3] > 0 ? t[0] / t[3] : std::nan("");
}

double TrainStep::accuracy() {
  const std::vector<double> t = totals();
  return t[3] > 0 && loss_->takesClassIndices() ? t[1] / t[3] : std::nan("");
}

void TrainStep::reset() {
  if (graph_) graph_->finish();  // the replays still adding to the sums
  sums_.fill(0.0);
  rows_ = terms_ = 0;
}

bool TrainStep::graphed() const { return graph_ && graph_->active(); }

int64_t TrainStep::replays() const { return graph_ ? graph_->replays() : 0; }

}  // namespace cyxwiz::ddp
