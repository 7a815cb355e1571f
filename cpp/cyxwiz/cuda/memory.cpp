// Allocation, copies and stream synchronisation. Device memory comes from the library's own
// stream-ordered pool (cudaMallocFromPoolAsync on the compute stream), cached by the release
// threshold set in state.cpp, so a free may precede the completion of kernels queued on the same stream.
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
  CX_CUDA_TRY(dev, "cudaMallocFromPoolAsync", cudaMallocFromPoolAsync(out, bytes, s->pool, s->compute));
  std::lock_guard<std::mutex> lock(s->memoryMutex);
  if (s->capturing) s->capturedAllocations.insert(*out);
  return {};
}

void ApiImpl::free(int dev, void* ptr) noexcept {
  if (!ptr) return;
  DeviceState* s = nullptr;
  if (!useDevice(dev, &s).empty()) return;
  std::lock_guard<std::mutex> lock(s->memoryMutex);
  if (s->capturing && s->capturedAllocations.erase(ptr) == 0) {
    s->heldFrees.push_back(ptr);  // freed once the capture ends (graphs.cpp)
    return;
  }
  const cudaError_t e = cudaFreeAsync(ptr, s->compute);
  if (e != cudaSuccess && s->pendingError.empty()) s->pendingError = cudaFailure("cudaFreeAsync", dev, e);
}

Status takePendingError(DeviceState* s) noexcept {
  std::lock_guard<std::mutex> lock(s->memoryMutex);
  Status e;
  e.swap(s->pendingError);
  return e;
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

namespace {

// The other device of a device-to-device copy on `dev`, or -1 when both sides are on `dev`.
Status peerDevice(int dev, const void* dst, const void* src, int* other) {
  *other = -1;
  for (const void* p : {dst, src}) {
    cudaPointerAttributes a{};
    CX_CUDA_TRY(dev, "cudaPointerGetAttributes", cudaPointerGetAttributes(&a, p));
    if (a.type == cudaMemoryTypeDevice && a.device != dev) *other = a.device;
  }
  return {};
}

// Event on `from`'s compute stream, waited for by `to`'s: `to` runs nothing queued after this
// before everything queued so far on `from` is done. The event belongs to `from`'s device (an event
// is recorded only on a stream of its own device); the calling thread ends on `dev`.
Status orderStreams(int dev, DeviceState* from, DeviceState* to) {
  CX_CUDA_TRY(from->dev, "cudaSetDevice", cudaSetDevice(from->dev));
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    e = cudaEventRecord(ev, from->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(to->compute, ev, 0);
    cudaEventDestroy(ev);  // the wait keeps what it needs
  }
  if (e != cudaSuccess) return cudaFailure("cudaStreamWaitEvent (peer copy)", from->dev, e);
  CX_CUDA_TRY(dev, "cudaSetDevice", cudaSetDevice(dev));
  return {};
}

// A copy between dev and another device, on dev's compute stream: it starts after the other device's
// queued kernels (which may still be writing the source or reading the destination), and the other
// device's later work (its stream-ordered free of the source, a kernel overwriting it) waits for it.
Status peerCopy(int dev, DeviceState* s, int other, void* dst, const void* src, size_t bytes) {
  DeviceState* o = nullptr;
  CX_TRY(useDevice(other, &o));
  CX_TRY(orderStreams(dev, o, s));
  CX_CUDA_TRY(dev, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->compute));
  return orderStreams(dev, s, o);
}

}  // namespace

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
  if (kind == CopyKind::DeviceToDevice) {
    int other = -1;
    CX_TRY(peerDevice(dev, dst, src, &other));
    if (other >= 0) return peerCopy(dev, s, other, dst, src, bytes);
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
  return takePendingError(s);
}

Status ApiImpl::query(int dev, bool* done) noexcept {
  *done = false;
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  cudaError_t e = cudaStreamQuery(s->compute);
  if (e == cudaErrorNotReady) {
    clearNotReady();
    return {};
  }
  if (e != cudaSuccess) return cudaFailure("cudaStreamQuery", dev, e);
  *done = true;
  return takePendingError(s);
}

}  // namespace cyxwiz::cuda
