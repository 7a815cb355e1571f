#include "cyxwiz/ddp/graphed_step.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/dropout.h"

namespace cyxwiz::ddp {

std::string GraphedStep::unsupportedReason(const DistributedDataParallel& ddp) {
  const nn::SequentialModel& model = *ddp.model();
  if (model.device().type != DeviceType::CUDA) return "the model is on the CPU (CUDA graphs need a GPU model)";
  if (ddp.worldSize() > 1 && !ddp.backend()->supportsGraphCapture()) {
    return "the CPU backend moves GPU gradients through host memory, which a CUDA graph cannot contain; use "
           "DISTRIBUTED_BACKEND=nccl";
  }
  if (ddp.config().checkGradients && ddp.worldSize() > 1) {
    return "check_gradients compares the gradients on the host at every step";
  }
  return "";
}

GraphedStep::GraphedStep(DistributedDataParallel& ddp, nn::Optimizer& optimizer, Step step)
    : ddp_(ddp),
      optimizer_(optimizer),
      step_(std::move(step)),
      backend_(ddp.worldSize() > 1 ? ddp.backend().get() : nullptr),
      device_(ddp.model()->device()) {
  const std::string why = unsupportedReason(ddp);
  CYX_CHECK(why.empty(), "CUDA graph step: ", why);
}

namespace {

// Every DropoutModule m runs, itself or inside it (a residual body, a Transformer block's sublayers,
// attention's weight dropout), in the order an eager forward draws their seeds.
void collectDropouts(nn::Module& m, std::vector<nn::DropoutModule*>& out) {
  if (auto* dropout = dynamic_cast<nn::DropoutModule*>(&m)) out.push_back(dropout);
  for (const auto& child : m.children()) collectDropouts(*child, out);
  for (nn::Module* inner : m.innerModules()) collectDropouts(*inner, out);
}

}  // namespace

GraphedStep::~GraphedStep() {
  if (backend_) backend_->removeGraphHolder(this);
  try {
    finish();
  } catch (...) {
    // Already reported by whoever waited last; a broken communicator has been aborted.
  }
  if (exec_) {
    device::cudaApi().graphDestroy(exec_);
    logInfo(makeString("CUDA graph: replayed ", replays_, " steps"));
  }
  optimizer_.disableGraphScalars();
  for (nn::DropoutModule* d : dropouts_) d->disableGraphSeed();
}

bool GraphedStep::fits(const Tensor& x, const Tensor& y) const {
  if (failed_) return false;
  return !x_.defined() ||
         (x.shape() == x_.shape() && y.shape() == y_.shape() && x.dtype() == x_.dtype() && y.dtype() == y_.dtype());
}

bool GraphedStep::run(const Tensor& x, const Tensor& y) {
  CYX_CHECK(fits(x, y), "CUDA graph step: the batch shape changed; run batches of another shape eagerly");
  if (!x_.defined()) {
    // The eager warm-up: allocates the optimizer state and warms cuBLASLt's plans and NCCL, none of
    // which may happen inside a capture.
    step_(x.to(device_), y.to(device_));
    x_ = Tensor::empty(x.shape(), x.dtype(), device_);
    y_ = Tensor::empty(y.shape(), y.dtype(), device_);
    return true;
  }
  if (!exec_) {
    std::string refused;
    try {
      capture();
    } catch (const Interrupted&) {
      throw;
    } catch (const DistError&) {
      throw;  // the communicator failed: eager steps would fail the same way
    } catch (const Error& e) {
      // A CUDA runtime, cuBLAS or NCCL version that refuses something in the capture. The captured
      // step did not run (a capture only records), so nothing was trained twice or lost.
      refused = e.what();
    }
    if (!agreeOnCapture(refused)) {
      logWarning(makeString("CUDA graph: the training step could not be captured (",
                            refused.empty() ? "another rank's capture was refused" : refused,
                            "); training without graphs"));
      failed_ = true;
      return false;
    }
  }
  // The last replay first, bounded: a hung collective surfaces here within the timeout, and the copies
  // below (which may wait for the stream while staging pageable memory) never wait on a stuck graph.
  finish();
  x_.copyFrom(x);
  y_.copyFrom(y);
  // The draws an eager step would make, in its order: the layers' forward, then the optimizer.
  for (nn::DropoutModule* d : dropouts_) d->prepareReplay();
  optimizer_.prepareReplay(ddp_.model()->parameters());
  if (backend_) backend_->computeWaitsForCollectives();
  device::check(device::cudaApi().graphLaunch(device_.index, exec_));
  void* event = nullptr;
  device::check(device::cudaApi().recordComputeEvent(device_.index, &event));
  pending_.reset(event, [](void* e) { device::cudaApi().eventRelease(e); });
  ++replays_;
  return true;
}

bool GraphedStep::agreeOnCapture(const std::string& refused) {
  const bool all = backend_ ? backend_->allAgree(refused.empty()) : refused.empty();
  if (all) {
    if (backend_) backend_->addGraphHolder(this);
    return true;
  }
  if (exec_) {
    device::cudaApi().graphDestroy(exec_);
    exec_ = nullptr;
  }
  return false;
}

void GraphedStep::dropGraph(bool wait) noexcept {
  try {
    if (wait) finish();
  } catch (...) {
    // Reported by whoever waited last; a broken communicator has been aborted.
  }
  pending_.reset();
  if (exec_) {
    device::cudaApi().graphDestroy(exec_);
    exec_ = nullptr;
    logInfo(makeString("CUDA graph: replayed ", replays_, " steps (graph released for the communicator's ",
                       wait ? "shutdown" : "abort", ")"));
  }
  failed_ = true;
}

void GraphedStep::capture() {
  cuda::Api& api = device::cudaApi();
  finish();
  // Nothing allocated before the capture may be freed inside it: drop what the warm-up step cached.
  ddp_.model()->releaseCaches();
  optimizer_.enableGraphScalars(device_);
  // Collected after the warm-up step: a layer may make its dropout at its first forward (attention's).
  for (nn::DropoutModule* d : dropouts_) d->disableGraphSeed();
  dropouts_.clear();
  for (const auto& m : ddp_.model()->modules()) collectDropouts(*m, dropouts_);
  for (nn::DropoutModule* d : dropouts_) d->enableGraphSeed(device_);
  auto capturing = [&](bool on) {
    optimizer_.setCapturing(on);
    for (nn::DropoutModule* d : dropouts_) d->setCapturing(on);
    if (backend_) backend_->setCapturing(on);
  };
  device::check(api.graphBeginCapture(device_.index));
  capturing(true);
  try {
    step_(x_, y_);
    ddp_.model()->releaseCaches();  // frees, inside the capture, what the step allocated
  } catch (...) {
    void* discarded = nullptr;
    api.graphEndCapture(device_.index, &discarded);  // ends the capture; its status adds nothing
    if (discarded) api.graphDestroy(discarded);
    capturing(false);
    ddp_.discardCapturedWork();
    ddp_.model()->releaseCaches();
    throw;
  }
  capturing(false);
  device::check(api.graphEndCapture(device_.index, &exec_));
  logInfo(makeString("CUDA graph: captured the training step for batches of shape ", shapeString(x_.shape()), " on ",
                     device_.str(), "; full batches replay it as one launch"));
}

void GraphedStep::finish() {
  if (!pending_) return;
  std::shared_ptr<void> event = std::move(pending_);
  if (backend_) {
    backend_->awaitReplay(event.get(), makeString("the replayed training step #", replays_, " (CUDA graph)"));
  } else {
    // No collective in the graph: it finishes on its own.
    device::check(device::cudaApi().synchronize(device_.index));
  }
}

}  // namespace cyxwiz::ddp
