// Fused optimizer steps, the formulas of nn/sgd.cpp and nn/adam.cpp (kernel_math.h), over several
// parameters per launch: blockIdx.y picks the parameter, blockIdx.x strides through its elements.
// The parameters' pointers travel in the kernel's arguments (a by-value batch), so no table is
// copied to the device. The per-step scalars come as arguments, or from device memory (`scalars`,
// api.h) for a step that a CUDA graph replays: each thread then reads them when the kernel runs.
// ops_optim.cpp splits the parameters into batches of kTensorsPerLaunch.
#include "cyxwiz/cuda/kernel_utils.cuh"
#include "cyxwiz/cuda/launch.h"

namespace cyxwiz::cuda {

namespace {

struct TensorBatch {
  OptimizerTensor t[kTensorsPerLaunch];
};

TensorBatch batchOf(const OptimizerTensor* tensors, int count) {
  TensorBatch batch{};
  for (int j = 0; j < count; ++j) batch.t[j] = tensors[j];
  return batch;
}

__global__ void sgdKernel(TensorBatch batch, float lr, float mu, float wd, bool nesterov, const float* scalars) {
  lr = sgdLearningRate(lr, scalars);
  const OptimizerTensor t = batch.t[blockIdx.y];
  for (int64_t i = globalIndex(); i < t.n; i += globalStride()) sgdElement(t, i, lr, mu, wd, nesterov);
}

__global__ void adamKernel(TensorBatch batch, AdamScalars given, float b1, float b2, float eps, float l2,
                           const float* scalars) {
  const AdamScalars s = adamScalars(given, scalars);
  const OptimizerTensor t = batch.t[blockIdx.y];
  for (int64_t i = globalIndex(); i < t.n; i += globalStride()) adamElement(t, i, s, b1, b2, eps, l2);
}

// As many blocks in x as the largest parameter needs, one row of blocks per parameter.
dim3 gridOf(int count, int64_t largest) { return dim3(gridFor(largest), static_cast<unsigned>(count)); }

}  // namespace

void launchSgd(cudaStream_t s, const OptimizerTensor* tensors, int count, int64_t largest, float lr, float momentum,
               float weightDecay, bool nesterov, const float* scalars) {
  sgdKernel<<<gridOf(count, largest), kThreads, 0, s>>>(batchOf(tensors, count), lr, momentum, weightDecay, nesterov,
                                                        scalars);
}

void launchAdam(cudaStream_t s, const OptimizerTensor* tensors, int count, int64_t largest, float stepSize, float b1,
                float b2, float eps, float invSqrtBc2, float l2, float decay, const float* scalars) {
  adamKernel<<<gridOf(count, largest), kThreads, 0, s>>>(batchOf(tensors, count),
                                                         AdamScalars{stepSize, invSqrtBc2, decay}, b1, b2, eps, l2,
                                                         scalars);
}

}  // namespace cyxwiz::cuda
