// GPU tensors on the CPU backend: copied through pinned host memory and back, as Gloo does. This is
// the fallback when NCCL is unavailable, and what lets several ranks share one GPU.
#pragma once

#include <memory>
#include <mutex>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::comm::cpu {

class PinnedStaging {
 public:
  // Serialises staged collectives: the pinned buffers are reused between calls.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }
  // A pinned host tensor shaped like `like` (slot 0 or 1, grown on demand); hold lock() while using it.
  Tensor host(int slot, const Tensor& like);

 private:
  std::mutex mutex_;
  std::shared_ptr<void> memory_[2];
  size_t bytes_[2] = {0, 0};
};

}  // namespace cyxwiz::comm::cpu
