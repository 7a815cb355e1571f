// GraphedStep: a training step on a GPU (forward, loss, backward, the gradient all-reduce and the
// optimizer) captured once into a CUDA graph and replayed for every batch of the same size. A small
// model's step is some thirty kernel launches, each with its host work; replayed, it is one launch,
// and the GPU no longer waits for the host.
//
// What makes a step replayable (a graph replays its kernels with the arguments of the capture):
//  - the batch is copied into static device buffers before each replay;
//  - the optimizer reads its per-step scalars, and Dropout its seed, from device memory rewritten
//    before each replay with the values an eager step would use (Optimizer::prepareReplay,
//    DropoutModule::prepareReplay); the optimizer's state is allocated by the eager warm-up step;
//  - the step's running loss and correct count go to device buffers that outlive the graph;
//  - a collective's completion is a graph edge, not a host poll (comm::Backend::setCapturing);
//  - whatever the step allocates it frees inside the capture (the layers drop their caches before
//    the capture ends), so every replay starts from the same memory and nothing leaks.
// Nothing waits forever: before the next replay and before any host read, the last replay is awaited
// with the backend's timeout and abort (awaitReplay), as an eager collective is.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/nn/dropout.h"

namespace cyxwiz::ddp {

class GraphedStep final : public comm::Backend::GraphHolder {
 public:
  // Runs one step on (x, y), both on the model's device; the same function is run eagerly and captured.
  using Step = std::function<void(const Tensor& x, const Tensor& y)>;

  // Why this DDP's step cannot be captured, or "" when it can.
  static std::string unsupportedReason(const DistributedDataParallel& ddp);

  GraphedStep(DistributedDataParallel& ddp, nn::Optimizer& optimizer, Step step);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // One step on a host (or device) batch. The first call runs it eagerly and fixes the batch shape;
  // the second captures the step and replays it; later calls replay it. Batches of another shape
  // (a last, shorter batch) must be run eagerly by the caller: fits() says which. When the CUDA
  // runtime refuses the capture, a warning says why, run() returns false without having trained on
  // the batch, and fits() is false from then on: the caller trains eagerly.
  bool run(const Tensor& x, const Tensor& y);
  bool fits(const Tensor& x, const Tensor& y) const;
  // Waits for the last replay (bounded by DISTRIBUTED_TIMEOUT_MS with NCCL); call before reading
  // anything the step wrote on the host.
  void finish();
  int64_t replays() const { return replays_; }
  // False once the capture was refused (on any rank) or the graph dropped: steps run eagerly.
  bool active() const { return !failed_; }
  // The backend is shutting down or failed: destroy the graph (after the last replay when `wait`);
  // steps run eagerly from now on.
  void dropGraph(bool wait) noexcept override;

 private:
  void capture();
  // Every rank replays or none does (a rank replaying beside one stepping eagerly would pair
  // different collectives): false, with the graph destroyed, when any rank's capture was refused.
  bool agreeOnCapture(const std::string& refused);
  bool failed_ = false;  // the capture was refused: no graph, eager steps

  DistributedDataParallel& ddp_;
  nn::Optimizer& optimizer_;
  Step step_;
  comm::Backend* backend_;   // null: no collective in the graph (world size 1)
  Device device_;
  Tensor x_, y_;             // the static inputs the graph reads
  void* exec_ = nullptr;     // the instantiated graph
  std::vector<nn::DropoutModule*> dropouts_;  // their seeds are drawn before each replay
  std::shared_ptr<void> pending_;  // event after the last replay
  int64_t replays_ = 0;
};

}  // namespace cyxwiz::ddp
