// Per-device state, created on a device's first use and kept for the life of the process.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cyxwiz/cuda/api.h"

// cudnnHandle_t is `struct cudnnContext*` (cudnn_graph.h): declared here so that this header, which
// every file includes, needs no cudnn.h (cuDNN is optional, CYXWIZ_HAVE_CUDNN).
struct cudnnContext;

namespace cyxwiz::cuda {

// Block partials of the deterministic reductions (losses, correct counts): one slot per block of
// the first pass, summed in a fixed order by a single block.
constexpr int kMaxPartials = 1024;

// cuBLAS's recommended workspace for Hopper and later (4 MiB suffices before); given explicitly so
// that captured graphs reuse it instead of cuBLAS allocating one per capture. cuBLASLt's matmuls
// share it: both libraries use it only on the compute stream, so their uses are stream-ordered.
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

struct DeviceScratch {
  double partial[kMaxPartials];
  long long count[kMaxPartials];
};

struct DeviceState {
  int dev = -1;
  cudaMemPool_t pool = nullptr;  // ours, not the device's default pool (state.cpp)
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;  // stateless between calls: the stream is passed to each matmul
  void* blasWorkspace = nullptr;  // kBlasWorkspaceBytes, for both handles
  DeviceScratch* scratch = nullptr;
  cudaEvent_t computeMark = nullptr;  // reused by commWaitsForCompute
  // cuDNN's handle: created on the first convolution or pooling (cudnn.cpp), as cudnnCreate loads
  // cuDNN's sub-libraries and costs much more than the other handles; never destroyed.
  cudnnContext* dnn = nullptr;
  // Serialises the users of scratch (a reduction enqueues two kernels that share it), of the cuBLAS
  // handle's math mode and of the cuDNN handle and its cached descriptors, should two threads drive
  // one device.
  std::mutex mutex;

  // What free() must know while the compute stream is being captured (graphs.cpp, memory.cpp): a
  // cudaFreeAsync inside a capture of memory allocated before it would invalidate the capture with
  // no word of why, and replays would read freed memory. Such frees wait for the capture's end,
  // which then fails naming them. Guarded by memoryMutex.
  std::mutex memoryMutex;
  bool capturing = false;
  std::unordered_set<void*> capturedAllocations;  // allocated inside the current capture
  std::vector<void*> heldFrees;                   // freed inside it, allocated before it
  // A failed free outside a capture (free() returns nothing): reported by the next synchronize,
  // query or graphEndCapture of this device instead of being lost.
  Status pendingError;
};

// Makes `dev` current on the calling thread (the runtime's current device is per thread) and
// returns its state, creating it on first use.
Status useDevice(int dev, DeviceState** out) noexcept;

// Returns and clears the device's pendingError (memory.cpp).
Status takePendingError(DeviceState* s) noexcept;

// Api::setTF32's flag (blas.cpp), read by every GEMM path.
bool tf32Enabled() noexcept;

}  // namespace cyxwiz::cuda
