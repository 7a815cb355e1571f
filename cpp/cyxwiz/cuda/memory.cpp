// Allocation, copies and stream synchronisation. Device memory comes from the device's default
// stream-ordered pool (cudaMallocAsync on the compute stream), cached by the release threshold set
// in state.cpp, so a free may precede the completion of kernels queued on the same stream.
#include <cuda_runtime_api.h>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

Status ApiImpl::malloc(int dev, size_t bytes, void** out) noexcept {
  *out = nullptr;
  if (bytes == 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  CX_CUDA_TRY(dev, "cudaMallocAsync", cudaMallocAsync(out, bytes, s->compute));
  return {};
}

void ApiImpl::free(int dev, void* ptr) noexcept {
  if (!ptr) return;
  DeviceState* s = nullptr;
  if (!useDevice(dev, &s).empty()) return;
  // Errors ignored: at process exit the runtime may already be gone. Clear them so they do not
  // surface in this thread's next launch check.
  if (cudaFreeAsync(ptr, s->compute) != cudaSuccess) cudaGetLastError();
}

Status ApiImpl::mallocHost(size_t bytes, void** out) noexcept {
  *out = nullptr;
  if (bytes == 0) return {};
  CX_CUDA_TRY(-1, "cudaMallocHost", cudaMallocHost(out, bytes));
  return {};
}

void ApiImpl::freeHost(void* ptr) noexcept {
  if (ptr && cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

Status ApiImpl::copy(int dev, void* dst, const void* src, size_t bytes, CopyKind kind) noexcept {
  if (bytes == 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  cudaMemcpyKind k;
  switch (kind) {
    case CopyKind::HostToDevice: k = cudaMemcpyHostToDevice; break;
    case CopyKind::DeviceToHost: k = cudaMemcpyDeviceToHost; break;
    case CopyKind::DeviceToDevice: k = cudaMemcpyDeviceToDevice; break;
    default: return "copy on cuda:" + std::to_string(dev) + ": unknown CopyKind " + std::to_string(int(kind));
  }
  CX_CUDA_TRY(dev, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, k, s->compute));
  bool wait = kind == CopyKind::DeviceToHost;  // the host reads the bytes next
  if (kind == CopyKind::HostToDevice) {
    // From pageable memory cudaMemcpyAsync returns once `src` is staged, so it may be reused. From
    // pinned memory the DMA reads `src` later, so wait for it, as the contract promises. (Host copies
    // are not allowed inside a graph capture, api.h.)
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, src) != cudaSuccess) {
      cudaGetLastError();
    } else {
      wait = a.type == cudaMemoryTypeHost;
    }
  }
  if (wait) CX_CUDA_TRY(dev, "cudaStreamSynchronize", cudaStreamSynchronize(s->compute));
  return {};
}

Status ApiImpl::memsetZero(int dev, void* dst, size_t bytes) noexcept {
  if (bytes == 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  CX_CUDA_TRY(dev, "cudaMemsetAsync", cudaMemsetAsync(dst, 0, bytes, s->compute));
  return {};
}

Status ApiImpl::synchronize(int dev) noexcept {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  CX_CUDA_TRY(dev, "cudaStreamSynchronize", cudaStreamSynchronize(s->compute));
  return {};
}

Status ApiImpl::query(int dev, bool* done) noexcept {
  *done = false;
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  cudaError_t e = cudaStreamQuery(s->compute);
  if (e == cudaErrorNotReady) return {};
  if (e != cudaSuccess) return cudaFailure("cudaStreamQuery", dev, e);
  *done = true;
  return {};
}

}  // namespace cyxwiz::cuda
