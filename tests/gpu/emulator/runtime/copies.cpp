// TEST DOUBLE, NOT GPU SUPPORT. Copies, memsets and pointer attributes. cudaMemcpyAsync checks its
// kind against the pointers when called (cudaErrorInvalidValue and an "emulator:" line saying why) and
// runs on the stream's worker. Host to device from pageable memory is staged at the call (the source
// may be reused at once, as with the runtime's staging buffer); from pinned memory the worker reads
// the source when the copy runs (DMA). Device to host is asynchronous for any host memory: the host
// sees the bytes only after synchronising. (The runtime may return only once a copy to pageable
// memory is done; the emulator is stricter, so that a missing synchronisation shows.) In a capture,
// copies with pageable memory are refused (cudaErrorStreamCaptureUnsupported, invalidating it).
#include <cstring>

#include "internal.h"

namespace cxemu {

namespace {

enum class Side { Host, Pinned, Device };

// Whatever the block's state: a freed one is caught when the copy runs (its Access).
Side sideOf(const void* p, int* dev) {
  BlockInfo i;
  if (!blockContaining(p, &i)) return Side::Host;
  if (dev) *dev = i.dev;
  return i.kind == BlockKind::Pinned ? Side::Pinned : Side::Device;
}

const char* sideName(Side s) {
  switch (s) {
    case Side::Host: return "pageable host memory";
    case Side::Pinned: return "pinned host memory";
    case Side::Device: return "device memory";
  }
  return "memory";
}

const char* kindName(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    case cudaMemcpyDefault: return "Default";
  }
  return "?";
}

}  // namespace

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return setLastError(cudaErrorInvalidMemcpyDirection);
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return failWhy(cudaErrorInvalidValue, "cudaMemcpyAsync with a null pointer");
  int dstDev = -1, srcDev = -1;
  const Side d = sideOf(dst, &dstDev), sr = sideOf(src, &srcDev);
  const bool dDev = d == Side::Device, sDev = sr == Side::Device;
  if (kind == cudaMemcpyDefault) {
    kind = dDev ? (sDev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                : (sDev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool wantDstDev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool wantSrcDev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dDev != wantDstDev || sDev != wantSrcDev) {
    const bool dstWrong = dDev != wantDstDev;
    const void* p = dstWrong ? dst : src;
    return failWhy(cudaErrorInvalidValue, std::string("cudaMemcpyAsync ") + kindName(kind) + " on " + s->name() + ": " +
                                              (dstWrong ? "the destination " : "the source ") + hexPtr(p) + " is " +
                                              sideName(dstWrong ? d : sr));
  }
  if (isCapturing(stream) && (d == Side::Host || sr == Side::Host)) {
    {
      std::lock_guard<std::mutex> lock(stateMutex());
      invalidateLocked(s->captureId, std::string("cudaMemcpyAsync ") + kindName(kind) + " with pageable host memory " +
                                         hexPtr(d == Side::Host ? dst : src) + " on " + s->name());
    }
    return setLastError(cudaErrorStreamCaptureUnsupported);
  }
  Item item;
  item.what = std::string("cudaMemcpyAsync ") + kindName(kind);
  item.peer = true;  // copies between devices need no peer access
  if (d != Side::Host) item.accesses.push_back({dst, count, true});
  if (sr != Side::Host) item.accesses.push_back({src, count, false});
  if (sr == Side::Host && d != Side::Host) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + count);
    item.fn = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    item.fn = [dst, src, count] { std::memmove(dst, src, count); };
  }
  const cudaError_t e = launchItem(s, std::move(item), false);
  if (e != cudaSuccess || d != Side::Host || sr != Side::Host) return e;
  // Host to host is synchronous with the host.
  return cudaStreamSynchronize(stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, cudaStreamLegacy);
  return e != cudaSuccess ? e : cudaStreamSynchronize(cudaStreamLegacy);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStream(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (count == 0) return cudaSuccess;
  const Side d = sideOf(devPtr, nullptr);
  if (d != Side::Device) {
    return failWhy(cudaErrorInvalidValue, "cudaMemsetAsync on " + s->name() + ": " + hexPtr(devPtr) + " is " +
                                              sideName(d));
  }
  Item item;
  item.what = "cudaMemsetAsync";
  item.peer = true;
  item.accesses.push_back({devPtr, count, true});
  item.fn = [devPtr, value, count] { std::memset(devPtr, value, count); };
  return launchItem(s, std::move(item), false);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  const cudaError_t e = cudaMemsetAsync(devPtr, value, count, cudaStreamLegacy);
  return e != cudaSuccess ? e : cudaStreamSynchronize(cudaStreamLegacy);
}

// Device memory: cudaMemoryTypeDevice and its device; pinned: cudaMemoryTypeHost; anything else
// (pageable or freed memory): cudaMemoryTypeUnregistered with success, as CUDA 11 and later.
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (!attributes) return setLastError(cudaErrorInvalidValue);
  attributes->type = cudaMemoryTypeUnregistered;
  attributes->device = -2;
  attributes->devicePointer = nullptr;
  attributes->hostPointer = nullptr;
  BlockInfo i;
  if (!ptr || !blockContaining(ptr, &i) || i.state == BlockState::Freed) return cudaSuccess;
  if (i.kind == BlockKind::Pinned) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = i.dev;
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  attributes->type = cudaMemoryTypeDevice;
  attributes->device = i.dev;
  attributes->devicePointer = const_cast<void*>(ptr);
  return cudaSuccess;
}

}  // extern "C"
