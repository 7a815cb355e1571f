// BatchNorm1DModule over (N, C) or (N, C, L) and BatchNorm2DModule over (N, C, H, W), with torch's
// semantics: in training the batch's mean and biased variance normalise, and the running statistics
// take momentum of the batch's mean and unbiased variance; in eval the running statistics normalise.
// Weight (C) starts at 1, bias (C) at 0; buffers running_mean, running_var, num_batches_tracked.
//
// Synchronised (cx.distributed.convert_sync_batchnorm, torch's SyncBatchNorm): the per-channel sums
// are all-reduced inside forward (the mean, then the squared deviations from it) and backward (the
// gradient's two sums), so N ranks of B rows normalise as one process of N*B rows.
//
// On a GPU the same steps run as the CUDA library's batch-norm kernels (cuda/api.h channelSums...),
// float64 statistics in device memory, all-reduced there (NCCL) when synchronised.
#pragma once

#include <functional>
#include <vector>

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

// Sums `values` (a float64 tensor on the CPU or a GPU) element-wise across the ranks of the job, in
// place; false when there is no job of more than one rank (the statistics are then this process's
// alone, as torch's SyncBatchNorm).
using StatsAllReduce = std::function<bool(const Tensor& values)>;
// Installed by the distributed layer (cyxwiz/ddp/sync_batchnorm.h); none means no job.
void setStatsAllReduce(StatsAllReduce reduce);

class BatchNormModule : public Module {
 public:
  // `imageDims`: 2 for (N, C, H, W), 1 for (N, C) or (N, C, L).
  BatchNormModule(int imageDims, int64_t numFeatures, double eps = 1e-5, double momentum = 0.1);

  std::string typeName() const override { return dims_ == 2 ? "BatchNorm2DModule" : "BatchNorm1DModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::vector<Buffer*> buffers() override { return {&runningMean_, &runningVar_, &batchesTracked_}; }
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  std::vector<Tensor> savedTensors() const override { return input_.defined() ? std::vector<Tensor>{input_} : std::vector<Tensor>{}; }

  int64_t numFeatures() const { return features_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }
  bool synchronized() const { return sync_; }
  void setSynchronized(bool sync) { sync_ = sync; }

 protected:
  void clearCache() override {
    input_ = Tensor();
    mean_.clear();
    invstd_.clear();
    gpuSums_ = gpuMean_ = gpuInvstd_ = Tensor();
  }

 private:
  // `values` summed across ranks when synchronised; returns whether they were.
  bool reduce(std::vector<double>& values) const;
  bool reduce(const Tensor& values) const;
  Tensor forwardGpu(const Tensor& input, int64_t N, int64_t S);
  Tensor backwardGpu(const Tensor& gradOutput);

  int dims_;
  int64_t features_;
  double eps_, momentum_;
  bool sync_ = false;
  Parameter weight_, bias_;
  Buffer runningMean_, runningVar_, batchesTracked_;
  Tensor input_;                      // what forward normalised
  std::vector<double> mean_, invstd_;  // the statistics it used, per channel
  bool batchStats_ = false;           // they were the batch's (training), not the running ones
  double count_ = 0;                  // values per channel behind them (all ranks when synchronised)
  // On a GPU: the forward's sums (C + 1 float64, the count last) and the statistics it used (C each).
  Tensor gpuSums_, gpuMean_, gpuInvstd_;
};

class BatchNorm1DModule : public BatchNormModule {
 public:
  explicit BatchNorm1DModule(int64_t numFeatures, double eps = 1e-5, double momentum = 0.1)
      : BatchNormModule(1, numFeatures, eps, momentum) {}
};

class BatchNorm2DModule : public BatchNormModule {
 public:
  explicit BatchNorm2DModule(int64_t numFeatures, double eps = 1e-5, double momentum = 0.1)
      : BatchNormModule(2, numFeatures, eps, momentum) {}
};

}  // namespace cyxwiz::nn
