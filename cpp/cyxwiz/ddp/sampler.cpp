#include "cyxwiz/ddp/sampler.h"

#include <random>

#include "cyxwiz/common/error.h"

namespace cyxwiz::ddp {

DistributedSampler::DistributedSampler(int64_t datasetSize, int numReplicas, int rank, bool shuffle, uint64_t seed,
                                       bool dropLast)
    : datasetSize_(datasetSize), replicas_(numReplicas), rank_(rank), shuffle_(shuffle), seed_(seed), dropLast_(dropLast) {
  CYX_CHECK(datasetSize > 0, "DistributedSampler: dataset_size=", datasetSize, " must be positive");
  CYX_CHECK(numReplicas > 0, "DistributedSampler: num_replicas=", numReplicas, " must be positive");
  CYX_CHECK(rank >= 0 && rank < numReplicas, "DistributedSampler: rank=", rank, " must be in [0, num_replicas=",
            numReplicas, ")");
  // As torch: dropping the tail leaves floor(n / R) per rank, padding gives ceil(n / R).
  localSize_ = dropLast ? datasetSize / numReplicas : (datasetSize + numReplicas - 1) / numReplicas;
}

void DistributedSampler::setEpoch(int64_t epoch) {
  CYX_CHECK(epoch >= 0, "DistributedSampler.set_epoch: epoch=", epoch, " must be >= 0");
  epoch_ = epoch;
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = i;
  std::mt19937_64 gen(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased draw in [0, i] by rejection: identical everywhere, unlike std::uniform_int_distribution.
    const uint64_t range = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t r;
    do r = gen(); while (r >= limit);
    std::swap(out[i], out[r % range]);
  }
  return out;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = permutation(datasetSize_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(static_cast<size_t>(datasetSize_));
    for (int64_t i = 0; i < datasetSize_; ++i) all[i] = i;
  }
  const int64_t padded = paddedSize();
  for (int64_t i = datasetSize_; i < padded; ++i) all.push_back(all[i % datasetSize_]);  // wrap around
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(localSize_));
  for (int64_t i = rank_; i < padded; i += replicas_) mine.push_back(all[i]);
  return mine;
}

DistributedBatchIterator::DistributedBatchIterator(std::shared_ptr<DistributedSampler> sampler, int64_t batchSize,
                                                   bool dropLast)
    : sampler_(std::move(sampler)), batchSize_(batchSize), dropLast_(dropLast) {
  CYX_CHECK(sampler_ != nullptr, "DistributedBatchIterator: sampler is None");
  CYX_CHECK(batchSize > 0, "DistributedBatchIterator: batch_size=", batchSize, " must be positive");
}

void DistributedBatchIterator::startPass() {
  indices_ = sampler_->indices();
  passEpoch_ = sampler_->epoch();
  taken_ = 0;
  started_ = true;
}

int64_t DistributedBatchIterator::numBatches() const {
  const int64_t n = sampler_->localSize();
  return dropLast_ ? n / batchSize_ : (n + batchSize_ - 1) / batchSize_;
}

bool DistributedBatchIterator::hasNext() {
  if (!started_ || passEpoch_ != sampler_->epoch()) startPass();
  return taken_ < numBatches();
}

std::vector<int64_t> DistributedBatchIterator::next() {
  if (!hasNext()) {
    throw InvalidArgument(makeString("DistributedBatchIterator.next: all ", numBatches(),
                                     " batches of this epoch were taken; call reset(epoch) or sampler.set_epoch(epoch) "
                                     "to start the next epoch"));
  }
  const int64_t begin = taken_ * batchSize_;
  const int64_t end = std::min<int64_t>(begin + batchSize_, static_cast<int64_t>(indices_.size()));
  ++taken_;
  return std::vector<int64_t>(indices_.begin() + begin, indices_.begin() + end);
}

void DistributedBatchIterator::reset(std::optional<int64_t> epoch) {
  if (epoch) sampler_->setEpoch(*epoch);
  startPass();
}

}  // namespace cyxwiz::ddp
