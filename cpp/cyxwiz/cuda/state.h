// Per-device state, created on a device's first use and kept for the life of the process.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda {

// Block partials of the deterministic reductions (losses, correct counts): one slot per block of
// the first pass, summed in a fixed order by a single block.
constexpr int kMaxPartials = 1024;

struct DeviceScratch {
  double partial[kMaxPartials];
  long long count[kMaxPartials];
  double sum;       // final results, copied to the host in one transfer
  long long total;
};

struct HostScalars {  // pinned, so the copy of a result is a plain DMA
  double sum;
  long long total;
};

struct DeviceState {
  int dev = -1;
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  cublasHandle_t blas = nullptr;
  void* blasWorkspace = nullptr;
  DeviceScratch* scratch = nullptr;
  HostScalars* host = nullptr;
  cudaEvent_t computeMark = nullptr;  // reused by commWaitsForCompute
  // Serialises the users of scratch/host (the reductions that return a scalar) and of the
  // handle's math mode, should two threads drive one device.
  std::mutex mutex;
};

// Makes `dev` current on the calling thread (the runtime's current device is per thread) and
// returns its state, creating it on first use.
Status useDevice(int dev, DeviceState** out) noexcept;

}  // namespace cyxwiz::cuda
