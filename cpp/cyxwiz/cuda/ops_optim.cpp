// The ApiImpl methods of the fused optimizer steps (kernels_optim.cu): the parameters go in batches
// of kTensorsPerLaunch, one launch (launch.h) and its status per batch.
#include <algorithm>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

// Calls `launch(stream, tensors, k, largest)` for every kTensorsPerLaunch parameters whose largest
// has elements, reporting each launch's status as `name`.
template <class Launch>
Status launchBatches(int dev, const char* name, const OptimizerTensor* tensors, int count, Launch launch) {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  for (int start = 0; start < count; start += kTensorsPerLaunch) {
    const int k = std::min(kTensorsPerLaunch, count - start);
    int64_t largest = 0;
    for (int j = 0; j < k; ++j) largest = std::max(largest, tensors[start + j].n);
    if (largest <= 0) continue;
    launch(s->compute, tensors + start, k, largest);
    CX_TRY(launchStatus(name, dev));
  }
  return {};
}

}  // namespace

Status ApiImpl::sgdStep(int dev, const OptimizerTensor* tensors, int count, float lr, float momentum,
                        float weightDecay, bool nesterov, const float* scalars) noexcept {
  return launchBatches(dev, "sgdKernel", tensors, count,
                       [&](cudaStream_t stream, const OptimizerTensor* batch, int k, int64_t largest) {
                         launchSgd(stream, batch, k, largest, lr, momentum, weightDecay, nesterov, scalars);
                       });
}

Status ApiImpl::adamStep(int dev, const OptimizerTensor* tensors, int count, float stepSize, float b1, float b2,
                         float eps, float invSqrtBc2, float l2, float decay, const float* scalars) noexcept {
  return launchBatches(dev, "adamKernel", tensors, count,
                       [&](cudaStream_t stream, const OptimizerTensor* batch, int k, int64_t largest) {
                         launchAdam(stream, batch, k, largest, stepSize, b1, b2, eps, invSqrtBc2, l2, decay, scalars);
                       });
}

}  // namespace cyxwiz::cuda
