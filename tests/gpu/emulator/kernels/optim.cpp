// TEST DOUBLE, NOT GPU SUPPORT. The launches of cpp/cyxwiz/cuda/kernels_optim.cu on the host: one
// piece of queued work per batch of at most kTensorsPerLaunch parameters (ops_optim.cpp batches),
// running kernel_math.h's element updates. The scalars in device memory are read when it runs.
#include <utility>
#include <vector>

#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

using emulated::reads;
using emulated::writes;

namespace {

// Every buffer of the batch that the update touches (SGD without momentum has no m; v is Adam's).
std::vector<cxemu::Access> batchAccess(const std::vector<OptimizerTensor>& batch, bool adam, const float* scalars,
                                       int scalarCount) {
  std::vector<cxemu::Access> access;
  for (const OptimizerTensor& t : batch) {
    if (t.n <= 0) continue;  // its threads exit at once
    access.push_back(writes(t.p, t.n));
    access.push_back(reads(t.g, t.n));
    if (t.m) access.push_back(writes(t.m, t.n));
    if (adam) access.push_back(writes(t.v, t.n));
  }
  if (scalars) access.push_back(reads(scalars, scalarCount));
  return access;
}

}  // namespace

void launchSgd(cudaStream_t s, const OptimizerTensor* tensors, int count, int64_t /*largest*/, float lr,
               float momentum, float weightDecay, bool nesterov, const float* scalars) {
  std::vector<OptimizerTensor> batch(tensors, tensors + count);
  std::vector<cxemu::Access> access = batchAccess(batch, false, scalars, 1);
  cxemu::enqueue(s, "sgdKernel", std::move(access), [=] {
    const float rate = sgdLearningRate(lr, scalars);
    for (const OptimizerTensor& t : batch) {
      for (int64_t i = 0; i < t.n; ++i) sgdElement(t, i, rate, momentum, weightDecay, nesterov);
    }
  });
}

void launchAdam(cudaStream_t s, const OptimizerTensor* tensors, int count, int64_t /*largest*/, float stepSize,
                float b1, float b2, float eps, float invSqrtBc2, float l2, float decay, const float* scalars) {
  std::vector<OptimizerTensor> batch(tensors, tensors + count);
  std::vector<cxemu::Access> access = batchAccess(batch, true, scalars, 3);
  cxemu::enqueue(s, "adamKernel", std::move(access), [=] {
    const AdamScalars given = adamScalars(AdamScalars{stepSize, invSqrtBc2, decay}, scalars);
    for (const OptimizerTensor& t : batch) {
      for (int64_t i = 0; i < t.n; ++i) adamElement(t, i, given, b1, b2, eps, l2);
    }
  });
}

}  // namespace cyxwiz::cuda
