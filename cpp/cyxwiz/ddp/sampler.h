// DistributedSampler: which rows of a dataset this rank trains on, epoch by epoch.
// DistributedBatchIterator: those rows in batches.
//
// Unshuffled, the indices are exactly torch.utils.data.DistributedSampler's: the dataset is padded by
// wrapping around to a multiple of the world size (or its tail is dropped with dropLast), and rank r
// takes every world-th index starting at r. Shuffled, the permutation comes from seed + epoch, so it
// is the same on every rank and different every epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace cyxwiz::ddp {

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int numReplicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool dropLast = false);

  void setEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  std::vector<int64_t> indices() const;  // this rank's, for the current epoch

  int64_t localSize() const { return localSize_; }          // indices() length
  int64_t totalSize() const { return datasetSize_; }        // the dataset
  int64_t paddedSize() const { return localSize_ * replicas_; }  // all ranks' indices together
  int numReplicas() const { return replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t datasetSize_;
  int replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool dropLast_;
  int64_t epoch_ = 0;
  int64_t localSize_;
};

// A permutation of 0..n-1 drawn from `seed`; the same on every platform (no std distributions).
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

class DistributedBatchIterator {
 public:
  DistributedBatchIterator(std::shared_ptr<DistributedSampler> sampler, int64_t batchSize, bool dropLast = false);

  // Also starts a new pass when the sampler's epoch changed since this pass began (set_epoch).
  bool hasNext();
  std::vector<int64_t> next();  // InvalidArgument when the pass is over
  // Rewinds; with an epoch, sets it on the sampler first (a new shuffle).
  void reset(std::optional<int64_t> epoch = std::nullopt);
  int64_t numBatches() const;
  const std::shared_ptr<DistributedSampler>& sampler() const { return sampler_; }

 private:
  void startPass();

  std::shared_ptr<DistributedSampler> sampler_;
  int64_t batchSize_;
  bool dropLast_;
  std::vector<int64_t> indices_;
  int64_t taken_ = 0;  // batches handed out this pass
  int64_t passEpoch_ = -1;
  bool started_ = false;
};

}  // namespace cyxwiz::ddp
