// Backend: one virtual per collective, as every transport sees them. A backend overrides what it
// supports; the defaults fail with "<backend> does not support <collective>".
//
// Contract: every rank issues the same collectives in the same order (the CPU backend checks it).
// Each call returns a Work; the tensors must stay alive and untouched until it is done. With
// async=false the backend may run the collective on the caller's thread and return it completed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/types.h"
#include "cyxwiz/comm/work.h"
#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::comm {

// Asked every 100 ms by a collective that blocks its caller's thread: true stops it (Ctrl-C). The
// Python bindings install one that runs Python's signal handlers.
using InterruptCheck = bool (*)();
void setInterruptCheck(InterruptCheck check);
InterruptCheck interruptCheck();
// Throws Interrupted ("<what>: interrupted") when the installed check says so.
void throwIfInterrupted(const char* what);

// The signature of a collective on `t` (count and dtype from it; an undefined tensor for a barrier).
CallSignature callSignature(Collective c, const Tensor& t, ReduceOp op = ReduceOp::Sum, int root = 0);

class Backend {
 public:
  explicit Backend(const DistributedConfig& config) : config_(config) {}
  virtual ~Backend();

  virtual std::string name() const = 0;
  int rank() const { return config_.rank; }
  int worldSize() const { return config_.worldSize; }
  const DistributedConfig& config() const { return config_; }

  virtual std::shared_ptr<Work> allReduce(const Tensor& data, ReduceOp op, bool async);
  virtual std::shared_ptr<Work> broadcast(const Tensor& data, int src, bool async);
  // out: worldSize x in.numel() elements, rank r's input at block r.
  virtual std::shared_ptr<Work> allGather(const Tensor& in, const Tensor& out, bool async);
  // out: this rank's part of the reduced input (parts as numpy.array_split makes them).
  virtual std::shared_ptr<Work> reduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async);
  // The halves of an all-reduce, in place on `data`, parts as numpy.array_split makes them: after
  // reduceScatterInPlace this rank's part holds the reduction (the other parts hold anything);
  // allGatherInPlace gives every rank every rank's part. DDP's sharded optimizer step runs on them.
  // The defaults go through reduceScatter and allGather with temporaries (allGather padded to the
  // largest part).
  virtual std::shared_ptr<Work> reduceScatterInPlace(const Tensor& data, ReduceOp op, bool async);
  virtual std::shared_ptr<Work> allGatherInPlace(const Tensor& data, bool async);
  // The 16-bit gradient exchange (DDPConfig.gradient_dtype) of a float32 `data`, rounded on the fly:
  // bit for bit what rounding data * scale to `wire` on every rank, all-reducing that (partial:
  // reduce-scattering in place) and widening the result back into data (partial: this rank's part)
  // would leave, without the 16-bit copy and its two conversion passes. Only where
  // reducesRounded(data) (the CPU backend on one host, on a large buffer every rank maps).
  virtual bool reducesRounded(const Tensor& data) const;
  virtual std::shared_ptr<Work> allReduceRounded(const Tensor& data, DType wire, float scale, ReduceOp op, bool partial,
                                                 bool async);
  // DDP's fused optimizer step (ddp.h): the reduction of every rank's float32 `data` (partial: this
  // rank's part of it) handed to `consume` a cache-sized piece at a time as it is read from the peers'
  // buffers, on the caller's thread; `data` itself is left as it was. The bits all_reduce (or
  // reduceScatterInPlace) would leave, without writing them into the bucket and reading them back.
  // Only where reducesForStep(data) (the CPU backend on one host, a large buffer every rank maps).
  virtual bool reducesForStep(const Tensor& data) const;
  // wire: float32, or the 16-bit type of a rounded exchange (where reducesRounded(data)): the pieces
  // are then allReduceRounded's bits.
  virtual void reduceForStep(const Tensor& data, ReduceOp op, bool partial, DType wire, float scale,
                             const Collectives::StepConsumer& consume);
  virtual std::shared_ptr<Work> barrier(bool async);
  // out (on `dst` only; undefined elsewhere): worldSize x in.numel() elements, rank r's at block r.
  virtual std::shared_ptr<Work> gather(const Tensor& in, const Tensor& out, int dst, bool async);
  // in (on `src` only): worldSize x out.numel() elements; rank r gets block r into `out`.
  virtual std::shared_ptr<Work> scatter(const Tensor& in, const Tensor& out, int src, bool async);
  // Block r of `in` (inCounts[r] elements, in rank order) goes to rank r, which puts it at block
  // (this rank) of its `out` (outCounts elements per source rank).
  virtual std::shared_ptr<Work> allToAll(const Tensor& in, const Tensor& out, const std::vector<int64_t>& inCounts,
                                         const std::vector<int64_t>& outCounts, bool async);
  // Point-to-point, between this rank and one other only; always asynchronous (wait on the Work).
  // Messages from one rank with one tag arrive in the order they were sent.
  virtual std::shared_ptr<Work> send(const Tensor& data, int dst, int64_t tag);
  // src -1: from whichever rank sends first (Work::sourceRank() then says which).
  virtual std::shared_ptr<Work> recv(const Tensor& data, int src, int64_t tag);
  // Waits for queued work, says goodbye to the job, closes connections. Idempotent.
  virtual void shutdown() = 0;

  // The GPU whose streams run this backend's collectives (NCCL), or none: the CPU backend takes
  // tensors anywhere and moves GPU ones through host memory. DDP moves the model there.
  virtual std::optional<Device> device() const { return std::nullopt; }

  // CUDA graphs (ddp::GraphedStep). Only a backend whose collectives run on the GPU's streams can
  // be captured; the defaults below fail with "<backend> does not support CUDA graph capture".
  virtual bool supportsGraphCapture() const { return false; }
  // While capturing, a collective's Work.wait makes the compute stream wait for it (a graph edge)
  // instead of polling on the host, which capture forbids.
  virtual void setCapturing(bool capturing);
  // Makes the compute stream wait for every collective queued so far: a replay's collectives must
  // not run beside a pending async one.
  virtual void computeWaitsForCollectives();
  // Waits for `event` (recorded after a replay) as for a collective: bounded by
  // DISTRIBUTED_TIMEOUT_MS, throws on error or timeout. `what` names it in the message.
  virtual void awaitReplay(void* event, const std::string& what);

  // Something that holds a CUDA graph with this backend's collectives in it: shutdown and failure
  // drop the graph first, since a communicator cannot be finalized or aborted while a graph holds it.
  class GraphHolder {
   public:
    // Destroys the graph, after waiting for its last replay when `wait` (shutdown; not after a
    // failure, whose replay may never finish).
    virtual void dropGraph(bool wait) noexcept = 0;

   protected:
    ~GraphHolder() = default;
  };
  virtual void addGraphHolder(GraphHolder* holder);
  // Blocks while shutdown is dropping it. The default does nothing: nothing could be added.
  virtual void removeGraphHolder(GraphHolder* holder);
  // True when every rank passes `ok` (a host all_reduce, bounded by DISTRIBUTED_TIMEOUT_MS).
  virtual bool allAgree(bool ok);
  // A zeroed 1-D buffer for data this rank all-reduces again and again (DDP's gradient buckets). The
  // CPU backend on one host puts it in memory the other ranks map, so that all_reduce of the whole
  // buffer reads the peers' data where it lies; elsewhere (and by default) it is ordinary memory.
  // Collective: every rank calls it in the same order with the same size.
  virtual Tensor sharedZeros(int64_t elements, DType dtype);

 protected:
  [[noreturn]] void unsupported(const char* collective) const;
  DistributedConfig config_;
};

}  // namespace cyxwiz::comm
