#include "cyxwiz/comm/cpu/staging.h"

#include "cyxwiz/device/cuda.h"

namespace cyxwiz::comm::cpu {

Tensor PinnedStaging::host(int slot, const Tensor& like) {
  const size_t need = like.nbytes();
  if (need > bytes_[slot]) {
    cuda::Api& api = device::cudaApi();
    void* p = nullptr;
    const size_t grown = need + need / 2;  // fewer re-allocations when buckets vary in size
    device::check(api.mallocHost(grown, &p));
    memory_[slot] = std::shared_ptr<void>(p, [&api](void* q) { api.freeHost(q); });
    bytes_[slot] = grown;
  }
  return Tensor::fromExternal(memory_[slot].get(), like.shape(), like.dtype(), memory_[slot]);
}

}  // namespace cyxwiz::comm::cpu
