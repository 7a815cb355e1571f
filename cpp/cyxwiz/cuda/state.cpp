#include "cyxwiz/cuda/state.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <new>

#include "cyxwiz/cuda/errors.h"

namespace cyxwiz::cuda {

namespace {

constexpr int kMaxDevices = 64;

std::array<std::atomic<DeviceState*>, kMaxDevices> gStates{};
std::mutex gCreateMutex;

void release(DeviceState* s) noexcept {
  if (s->blas) cublasDestroy(s->blas);
  if (s->lt) cublasLtDestroy(s->lt);
  if (s->blasWorkspace) cudaFree(s->blasWorkspace);
  if (s->scratch) cudaFree(s->scratch);
  if (s->computeMark) cudaEventDestroy(s->computeMark);
  if (s->compute) cudaStreamDestroy(s->compute);
  if (s->comm) cudaStreamDestroy(s->comm);
  if (s->pool) cudaMemPoolDestroy(s->pool);
  cudaGetLastError();  // a failed creation leaves its error here; useDevice reports it
  delete s;
}

Status create(int dev, DeviceState* s) noexcept {
  s->dev = dev;
  // A pool of our own: the device's default pool is shared with every library of the process (CuPy,
  // PyTorch's cudaMallocAsync backend), whose release threshold is theirs to choose. Keeping freed
  // memory cached (threshold: never release) makes cudaMallocFromPoolAsync/cudaFreeAsync a caching
  // allocator.
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  CX_CUDA_TRY(dev, "cudaMemPoolCreate", cudaMemPoolCreate(&s->pool, &props));
  uint64_t threshold = UINT64_MAX;
  CX_CUDA_TRY(dev, "cudaMemPoolSetAttribute",
              cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  // Non-blocking: no implicit synchronisation with the legacy default stream other code may use.
  CX_CUDA_TRY(dev, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking));
  CX_CUDA_TRY(dev, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s->comm, cudaStreamNonBlocking));
  CX_CUDA_TRY(dev, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&s->computeMark, cudaEventDisableTiming));
  CX_CUDA_TRY(dev, "cudaMalloc", cudaMalloc(reinterpret_cast<void**>(&s->scratch), sizeof(DeviceScratch)));
  CX_CUDA_TRY(dev, "cudaMalloc", cudaMalloc(&s->blasWorkspace, kBlasWorkspaceBytes));
  CX_CUBLAS_TRY(dev, "cublasCreate", cublasCreate(&s->blas));
  CX_CUBLAS_TRY(dev, "cublasSetStream", cublasSetStream(s->blas, s->compute));
  CX_CUBLAS_TRY(dev, "cublasSetWorkspace", cublasSetWorkspace(s->blas, s->blasWorkspace, kBlasWorkspaceBytes));
  // alpha and beta are host scalars.
  CX_CUBLAS_TRY(dev, "cublasSetPointerMode", cublasSetPointerMode(s->blas, CUBLAS_POINTER_MODE_HOST));
  CX_CUBLAS_TRY(dev, "cublasLtCreate", cublasLtCreate(&s->lt));
  return {};
}

}  // namespace

Status useDevice(int dev, DeviceState** out) noexcept {
  *out = nullptr;
  if (dev < 0 || dev >= kMaxDevices) return "cuda:" + std::to_string(dev) + " is not a valid device index";
  CX_CUDA_TRY(dev, "cudaSetDevice", cudaSetDevice(dev));
  DeviceState* s = gStates[dev].load(std::memory_order_acquire);
  if (s) {
    *out = s;
    return {};
  }
  std::lock_guard<std::mutex> lock(gCreateMutex);
  s = gStates[dev].load(std::memory_order_acquire);
  if (!s) {
    s = new (std::nothrow) DeviceState;
    if (!s) return "cuda:" + std::to_string(dev) + ": out of host memory for the device state";
    Status st = create(dev, s);
    if (!st.empty()) {
      release(s);  // nothing cached: the next call tries again
      return st;
    }
    gStates[dev].store(s, std::memory_order_release);
  }
  *out = s;
  return {};
}

}  // namespace cyxwiz::cuda
