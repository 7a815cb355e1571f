// NcclBackend: collectives between GPUs through NCCL, one communicator per process on cuda:LOCAL_RANK.
//
// Rendezvous and everything on host memory go through an inner CpuBackend (the TCP store and ring):
// rank 0's NCCL unique id travels as a broadcast over it, and host tensors (DDP's architecture check,
// the trainer's metrics) keep working unchanged. Device tensors go to NCCL.
//
// Nothing blocks forever: the communicator is non-blocking, every wait polls its asynchronous error
// and gives up after DISTRIBUTED_TIMEOUT_MS by aborting it (ncclCommAbort returns every rank's
// stuck kernels), so a dead or absent peer becomes an error, not a hang, as PyTorch's watchdog does.
// The first error breaks the backend; later calls fail at once with it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/cuda/api.h"

namespace cyxwiz::comm::cpu {
class CpuBackend;
}  // namespace cyxwiz::comm::cpu

namespace cyxwiz::comm::nccl {

class NcclBackend final : public Backend {
 public:
  // The GPU this rank drives: cuda:LOCAL_RANK (modulo the visible GPUs). Throws, before any
  // rendezvous, when this process has no usable GPU.
  static Device deviceFor(const DistributedConfig& config);
  // `cpu`: the TCP world of the same config, already formed (shut down here if NCCL fails).
  NcclBackend(const DistributedConfig& config, const Device& gpu, std::shared_ptr<cpu::CpuBackend> cpu);
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }
  std::optional<Device> device() const override { return device_; }
  std::shared_ptr<Work> allReduce(const Tensor& data, ReduceOp op, bool async) override;
  std::shared_ptr<Work> broadcast(const Tensor& data, int src, bool async) override;
  std::shared_ptr<Work> allGather(const Tensor& in, const Tensor& out, bool async) override;
  std::shared_ptr<Work> reduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) override;
  std::shared_ptr<Work> barrier(bool async) override;
  void shutdown() override;

  // Polls until the communicator has finished enqueuing (or initialising); aborts it and throws on
  // error or when `deadline` passes. `what` names the operation in the message.
  void awaitComm(const std::string& what, Deadline deadline);
  // Polls `event` the same way; used by the collectives' Work.
  void awaitEvent(void* event, const std::string& what, Deadline deadline);

  // CUDA graphs (Backend's contract). A captured collective's completion is an edge of the graph;
  // the replay is then awaited as a whole with awaitEvent, watching the communicator (abort and
  // throw on error or timeout).
  bool supportsGraphCapture() const override { return true; }
  void setCapturing(bool capturing) override { capturing_ = capturing; }
  void computeWaitsForCollectives() override;
  void awaitReplay(void* event, const std::string& what) override;
  // NCCL (>= 2.26) finalizes, destroys and aborts a communicator only once every graph holding its
  // collectives is destroyed, so shutdown() and fail() drop them first; otherwise finalize() (or
  // exit, or a timeout's abort) with a graphed step alive would never return.
  void addGraphHolder(GraphHolder* holder) override;
  void removeGraphHolder(GraphHolder* holder) override;
  // Over the CPU world directly: a broken communicator does not stop the vote.
  bool allAgree(bool ok) override;

 private:
  std::shared_ptr<Work> enqueue(CallSignature call, const Tensor& send, const Tensor& recv, cuda::CollectiveKind kind,
                                bool async);
  // Naps (20 us for the first 20 ms, then 1 ms) until `done`, watching the communicator's
  // asynchronous error, the deadline (abort + DistTimeoutError) and Ctrl-C.
  void pollUntil(const std::string& what, Deadline deadline, const std::function<bool()>& done);
  // Runs a collective into `out` when it is on the GPU, else into a device copy that is copied back.
  std::shared_ptr<Work> onDevice(const Tensor& out, const std::function<std::shared_ptr<Work>(const Tensor&)>& run);
  void checkDuplicateGpu();
  void dropGraphs(bool wait);
  void checkUsable(const char* what);  // with mutex_ held
  // After an NCCL error every collective fails with it, host-tensor ones (TCP ring) included.
  void throwIfBroken();
  [[noreturn]] void fail(const std::string& message, bool timeout);
  std::string where() const;  // "rank 1/4 on cuda:1"

  std::shared_ptr<cpu::CpuBackend> cpu_;
  cuda::Api* api_ = nullptr;
  Device device_;
  void* comm_ = nullptr;
  std::mutex mutex_;  // one collective enqueued at a time
  uint64_t sequence_ = 0;
  std::exception_ptr broken_;
  bool capturing_ = false;
  std::mutex graphsMutex_;  // held while shutdown() drops the graphs
  std::vector<GraphHolder*> graphHolders_;
};

}  // namespace cyxwiz::comm::nccl
