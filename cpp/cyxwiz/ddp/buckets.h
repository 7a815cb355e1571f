// Gradient buckets: a model's parameter gradients regrouped into a few contiguous float32 buffers.
//
// Buckets fill in reverse layer order, a layer's parameters always in one bucket, the order backward produces gradients, so the first bucket is
// complete first and its all-reduce starts while backward is still running. Each Parameter::grad is
// rebound to a view into its bucket: layers accumulate straight into the buffer the collective
// sends, and no gradient is ever copied. The first bucket is capped at 1 MiB (as PyTorch DDP does)
// so that communication starts early; the others at bucket_size_mb.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cyxwiz/comm/work.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::ddp {

struct Bucket {
  Tensor storage;              // 1-D float32: the gradients of `params`, back to back
  std::vector<size_t> params;  // indices into model.parameters()
  int layers = 0;              // modules whose parameters are in this bucket
  int pending = 0;             // of those, how many have not finished this backward
  std::shared_ptr<comm::Work> work;  // the all-reduce (or its half) in flight, if any
  bool stale = false;          // holds local gradients no all-reduce has covered yet
  // Sharded optimizer step (DDPConfig::shardOptimizer) only:
  Tensor values;               // the parameters of `params`, back to back, as `storage` holds their gradients
  bool partial = false;        // reduce-scattered: only this rank's part of `storage` is averaged
  // 16-bit gradient exchange (DDPConfig::gradientDtype) only:
  DType wireDtype = DType::Float32;  // the 16-bit type, or float32: no 16-bit exchange
  Tensor wire;                 // `storage` rounded to 16 bits: what the all-reduce (or its half) carries;
                               // none where the backend rounds as it reduces (Backend::reducesRounded)
  bool onWire = false;         // `work` reduces `wire`: widen it back into `storage` when it is done
};

class GradientBuckets {
 public:
  // allocate(n): a bucket's zeroed float32 storage of n elements (on the model's device), memory
  // the backend may share with the other ranks (Backend::sharedZeros).
  GradientBuckets(nn::SequentialModel& model, size_t capBytes, size_t firstCapBytes,
                  const std::function<Tensor(int64_t)>& allocate);

  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The bucket holding `module`'s parameters (none for parameterless layers).
  const std::vector<size_t>& bucketsOf(const nn::Module* module) const;
  size_t parameterCount() const { return parameterCount_; }

 private:
  std::vector<Bucket> buckets_;
  std::map<const nn::Module*, std::vector<size_t>> byModule_;
  size_t parameterCount_ = 0;
};

}  // namespace cyxwiz::ddp
