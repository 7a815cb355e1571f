// DistributedDataParallel: one model replica per rank, gradients averaged across ranks every step.
//
//   forward            the model's forward
//   backward           the model's backward; as each layer's gradients land in their bucket, a
//                      bucket whose layers are all done has its all-reduce (AVG) queued on the
//                      communication thread, overlapping the rest of backward
//   syncGradients      waits for those all-reduces (reducing anything accumulated under no_sync)
//   updateParameters   the optimizer step, bucket by bucket as each all-reduce lands (the step of
//                      the first buckets overlaps the reduction of the last), then zeroes the gradients
//
// Sharded optimizer step (DDPConfig::shardOptimizer, CPU backend), as ZeRO stage 1: each bucket's
// parameters also live back to back in a buffer like its gradients. A bucket is reduce-scattered
// instead of all-reduced; each rank updates only its part of the bucket (the optimizer keeps state
// for that part alone) and the buckets of parameters are all-gathered. Every rank moves the same
// bytes as an all-reduce but runs the optimizer on 1/N of the parameters with 1/N of its state.
// syncGradients completes the gradients (all-gathers them) for code that reads or clips them.
//
// 16-bit gradient exchange (DDPConfig::gradientDtype bfloat16 or float16): each bucket is rounded
// into a 16-bit copy when its layers are done, that copy is all-reduced (or reduce-scattered), and the
// result is widened back into the float32 bucket when the step waits for it (ddp/wire.h). float16 is
// pre-divided by the world size and summed, so that sums cannot overflow (torch's fp16_compress_hook).
// Accumulation under no_sync, the optimizer and its state stay float32. With a GPU model (NCCL, or the
// CPU backend staging through the host) the rounding and widening are kernels on the compute stream:
// the narrowing kernel, then the collective (which NCCL starts after the compute stream's work), then,
// once the step waits for it, the widening kernel; a CUDA graph captures all three.
//
// Overlap needs a spare core per rank for the communication thread: with fewer (more ranks than half
// the cores on this machine) it only takes time from the other ranks' computation, so the buckets
// are reduced on the caller's thread at sync time instead. CYXWIZ_DDP_OVERLAP=1/0 forces either.
//
// Fused step (CPU backend, one host, where nothing overlaps: CYXWIZ_DDP_FUSED_STEP=1/0 forces it on or
// off): updateParameters does not all-reduce a bucket and then step on it; the optimizer reads each
// piece of the average as it is reduced from every rank's shared bucket, in rank order (the bits the
// all-reduce would leave), and the average is never written. The plain step saves the all-reduce's
// write of the average and its all-gather (two ranks only: each rank then reads every bucket whole,
// which beyond two costs more than it saves); the sharded step saves the write and re-read of its part
// at any size. Buckets under 1 MiB take the all-reduce unless CYXWIZ_DDP_FUSED_STEP=1 (there the
// fused step measured slower). Gradients read through sync_gradients(), check_gradients, a GradScaler
// or a 16-bit exchange with its 16-bit copy take the all-reduce as before; a 16-bit exchange rounded as the
// peers' buckets are read takes the fused step too (reduceForStep rounds the pieces the same way; in the
// plain step each rank rounds its own part in place and reads the peer's where the peer rounded it).
//
// Construction is collective: the ranks compare architecture fingerprints (a different model on one
// rank is an error on every rank) and, with broadcastParameters, take rank 0's parameters.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/ddp/buckets.h"
#include "cyxwiz/nn/optimizer.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::ddp {

struct DDPConfig {
  bool broadcastParameters = true;
  // Rank 0's buffers (BatchNorm's running statistics) sent to every rank before each training forward,
  // as torch's broadcast_buffers=True.
  bool broadcastBuffers = true;
  double bucketSizeMb = 25.0;
  bool findUnusedParameters = false;  // accepted for PyTorch parity; every layer gets a gradient here
  bool checkGradients = false;        // also on with CYXWIZ_DDP_CHECK_GRADIENTS=1
  bool shardOptimizer = false;        // also on with CYXWIZ_DDP_SHARD_OPTIMIZER=1 (see above)
  DType gradientDtype = DType::Float32;  // what gradients travel in: Float32, BFloat16 or Float16 (see above)
};

// The settings every rank must share ("gradient_dtype=bfloat16 shard_optimizer=False"); compared at
// construction beside the architecture.
std::string describeSharedSettings(const DDPConfig& config);

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::SequentialModel> model, const DDPConfig& config = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Tensor forward(const Tensor& input);
  Tensor backward(const Tensor& gradOutput, bool needInputGrad = false);
  void syncGradients();
  void updateParameters(nn::Optimizer& optimizer);
  void zeroGrad();
  // For GradScaler (ddp/scaled_gradients.h): waits for the reductions, multiplies this rank's averaged
  // gradients by `factor` and returns whether they are all finite, the same answer on every rank (a
  // collective). CPU models only.
  bool unscaleGradients(float factor);
  // The optimizer's whole state; with a sharded step its shards are put together (a collective:
  // every rank calls it). What checkpoints store.
  nn::OptimizerState optimizerState(const nn::Optimizer& optimizer);
  bool shardsOptimizer() const { return !shard_.empty(); }
  // Forgets the collectives of a CUDA graph capture that was abandoned: they never ran, so there is
  // nothing to wait for (ddp/graphed_step.cpp).
  void discardCapturedWork();

  // Rank 0's buffers to every rank (a collective; nothing to do without buffers). forward calls it in
  // training when DDPConfig::broadcastBuffers; the trainer also at each epoch's end, so that
  // evaluation, checkpoints and the finished model are the same on every rank.
  void broadcastBuffers();

  // False inside no_sync(): backward only accumulates locally.
  void setRequireSync(bool require) { requireSync_ = require; }
  bool requireSync() const { return requireSync_; }

  // (parameter count, bytes) per bucket, in reduction order.
  std::vector<std::pair<int64_t, int64_t>> bucketSizes() const;
  std::vector<nn::Parameter*> parameters() const { return model_->parameters(); }
  const std::shared_ptr<nn::SequentialModel>& model() const { return model_; }
  const std::shared_ptr<comm::Backend>& backend() const { return backend_; }
  int rank() const { return backend_->rank(); }
  int worldSize() const { return backend_->worldSize(); }
  bool isMaster() const { return rank() == 0; }
  const DDPConfig& config() const { return config_; }
  // Whether bucket all-reduces run on the communication thread during backward (see overlapPolicy).
  bool overlap() const { return overlap_; }

 private:
  void checkSameArchitecture();
  void broadcastParameters();
  void onGradsReady(const nn::Module& module);
  void launch(Bucket& bucket);  // async when overlapping, else on the caller's thread
  // Waits for the bucket's collective; a 16-bit one is widened back into the float32 gradients.
  void finish(Bucket& bucket);
  // Launches every bucket with gradients no all-reduce has covered yet, except (exceptFusible, from
  // updateParameters) those the fused step will reduce.
  void launchStale(bool exceptFusible);
  // Whether updateParameters reads this bucket's reduction straight into the optimizer (the fused step)
  // when it holds gradients no all-reduce has covered.
  bool fusible(const Bucket& bucket) const;
  // The fused step of one bucket: the optimizer updates its parameters from the peers' buckets as they
  // are reduced (Backend::reduceForStep); the bucket itself is not averaged.
  void stepFromPeers(Bucket& bucket, nn::Optimizer& optimizer, const std::vector<nn::Parameter*>& params);
  void waitAll();
  // Sharded step: rebinds every parameter's value to a view into its bucket's `values`.
  void shardParameters();
  // All-gathers the gradients of reduce-scattered buckets, so that every rank holds them whole.
  void completeGradients();
  void checkModelUnchanged(const char* operation) const;
  // The model's gradient guard: waits for in-flight all-reduces; refuses a step on stale gradients.
  void guardGradients(nn::SequentialModel::GradientUse use);
  // check_gradients: compares per-parameter checksums of gradients and parameters across ranks.
  void compareAcrossRanks();
  std::vector<std::string> parameterNames() const;

  std::shared_ptr<nn::SequentialModel> model_;
  DDPConfig config_;
  std::shared_ptr<comm::Backend> backend_;
  std::unique_ptr<GradientBuckets> buckets_;
  std::string fingerprint_;
  size_t moduleCount_ = 0;
  bool overlap_ = true;
  bool fusedStep_ = false;    // see "Fused step" above
  bool fusedForced_ = false;  // CYXWIZ_DDP_FUSED_STEP=1: also buckets under 1 MiB
  bool requireSync_ = true;
  bool inBackward_ = false;  // hooks launch all-reduces only during our own backward
  std::set<std::string> warned_;
  // Sharded step: elements [first, second) of each parameter (model.parameters() order) are this
  // rank's to update; empty when the step is not sharded.
  std::vector<std::pair<int64_t, int64_t>> shard_;
};

}  // namespace cyxwiz::ddp
