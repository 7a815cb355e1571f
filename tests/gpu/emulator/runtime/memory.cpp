// TEST DOUBLE, NOT GPU SUPPORT. Allocation: cudaMalloc/cudaFree (synchronous; cudaFree and
// cudaFreeHost wait for the device's work, as the runtime does), the stream-ordered
// cudaMallocAsync/cudaMallocFromPoolAsync/cudaFreeAsync (the allocation becomes usable, and the free
// happens, when the stream reaches them), memory pools (each device's default pool, pools made by
// cudaMemPoolCreate; which pool an allocation came from and whether the default pool was changed are
// recorded for the test hooks) and pinned host memory. In a capture, cudaMallocAsync and cudaFreeAsync
// become graph nodes (capture.cpp). Calls CUDA counts as unsafe during a capture (cudaMalloc, cudaFree,
// cudaMallocHost, cudaFreeHost) are refused under the capture mode rules and invalidate the capture.
#include <set>

#include "internal.h"

struct CUmemPoolHandle_st {
  int dev = 0;
  bool isDefault = false;
  uint64_t releaseThreshold = 0;
  int reuse[3] = {1, 1, 1};  // the three reuse policies, on by default
  uint64_t usedHigh = 0;
};

namespace cxemu {

namespace {

struct Pools {
  std::set<CUmemPoolHandle_st*> live;
  CUmemPoolHandle_st* defaults[kMaxDevices] = {};
  CUmemPoolHandle_st* current[kMaxDevices] = {};
  int defaultModified[kMaxDevices] = {};  // bit 0: an attribute set, bit 1: the device's pool replaced
};

Pools& pools() {
  static auto* p = new Pools;  // never destroyed (workers may outlive main)
  return *p;
}

// stateMutex held.
CUmemPoolHandle_st* defaultPoolLocked(int dev) {
  Pools& p = pools();
  if (!p.defaults[dev]) {
    auto* pool = new CUmemPoolHandle_st;
    pool->dev = dev;
    pool->isDefault = true;
    p.defaults[dev] = pool;
    p.live.insert(pool);
  }
  return p.defaults[dev];
}

CUmemPoolHandle_st* currentPoolLocked(int dev) {
  Pools& p = pools();
  return p.current[dev] ? p.current[dev] : defaultPoolLocked(dev);
}

cudaError_t deviceCheck(int dev) {
  const cudaError_t e = deviceError(dev);
  if (e != cudaSuccess) return setLastError(e == cudaErrorInvalidValue ? cudaErrorNoDevice : e);
  return checkSticky(dev);
}

// The capture that refuses a potentially unsafe call from this thread, invalidated (stateMutex held).
cudaError_t refuseUnsafeLocked(const char* call) {
  const uint64_t id = unsafeCallCaptureLocked();
  if (!id) return cudaSuccess;
  invalidateLocked(id, std::string(call) + " (not allowed during a capture in this capture mode)");
  return setLastError(cudaErrorStreamCaptureUnsupported);
}

cudaError_t mallocAsync(void** ptr, size_t size, CUmemPoolHandle_st* pool, cudaStream_t stream) {
  if (!ptr) return setLastError(cudaErrorInvalidValue);
  *ptr = nullptr;
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (!pool) pool = currentPoolLocked(s->dev);
  if (!pools().live.count(pool)) return setLastError(cudaErrorInvalidValue);
  if (size == 0) return cudaSuccess;
  if (s->captureId) return captureAllocLocked(s, size, ptr);
  if (cudaError_t e = legacyImplicitLocked(s)) return e;
  void* p = blockCreate(size, pool->dev, BlockKind::Device, BlockState::Pending,
                        pool->isDefault ? PoolKind::Default : PoolKind::Created, pool,
                        "cudaMallocAsync on " + s->name());
  if (!p) return setLastError(cudaErrorMemoryAllocation);
  Item item;
  item.what = "cudaMallocAsync";
  item.delay = false;
  item.skipWhenLost = false;
  item.fn = [p] {
    BlockInfo i;
    if (blockAt(p, &i) && i.state == BlockState::Pending) blockSetState(p, BlockState::Live, "");
  };
  submit(s, std::move(item));
  const uint64_t used = liveBytes(pool->dev, pool);
  if (used > pool->usedHigh) pool->usedHigh = used;
  *ptr = p;
  return cudaSuccess;
}

}  // namespace

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (!devPtr) return setLastError(cudaErrorInvalidValue);
  *devPtr = nullptr;
  const int dev = currentDevice();
  if (cudaError_t e = deviceCheck(dev)) return e;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (cudaError_t e = refuseUnsafeLocked("cudaMalloc")) return e;
  }
  if (size == 0) return cudaSuccess;
  void* p = blockCreate(size, dev, BlockKind::Device, BlockState::Live, PoolKind::None, nullptr, "cudaMalloc");
  if (!p) return setLastError(cudaErrorMemoryAllocation);
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  if (cudaError_t e = checkSticky(currentDevice())) return e;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (cudaError_t e = refuseUnsafeLocked("cudaFree")) return e;
  }
  if (!devPtr) return cudaSuccess;
  BlockInfo i;
  if (!blockAt(devPtr, &i) || i.kind == BlockKind::Pinned || i.kind == BlockKind::Foreign) {
    return failWhy(cudaErrorInvalidValue, "cudaFree of " + hexPtr(devPtr) + ", not the start of a device allocation");
  }
  if (i.state == BlockState::Freed || i.freeQueued) {
    return failWhy(cudaErrorInvalidValue, "cudaFree of " + hexPtr(devPtr) + ", already freed (" + i.note + ")");
  }
  synchronizeAll(i.dev);  // cudaFree waits for the device's work
  blockSetState(devPtr, i.kind == BlockKind::Graph ? BlockState::Reserved : BlockState::Freed, "freed by cudaFree");
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return mallocAsync(devPtr, size, nullptr, hStream);
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  if (!memPool) return setLastError(cudaErrorInvalidValue);
  return mallocAsync(ptr, size, memPool, stream);
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(hStream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (!devPtr) return cudaSuccess;
  if (s->captureId) return captureFreeLocked(s, devPtr);
  BlockInfo i;
  if (!blockAt(devPtr, &i) || i.kind == BlockKind::Pinned) {
    return failWhy(cudaErrorInvalidValue,
                   "cudaFreeAsync of " + hexPtr(devPtr) + " on " + s->name() + ", not the start of a device allocation");
  }
  if (i.kind == BlockKind::Foreign) {
    return failWhy(cudaErrorInvalidValue, "cudaFreeAsync of " + hexPtr(devPtr) + ", memory of another library");
  }
  if (i.state == BlockState::Freed || i.state == BlockState::Reserved || i.freeQueued) {
    return failWhy(cudaErrorInvalidValue, "cudaFreeAsync of " + hexPtr(devPtr) + " on " + s->name() +
                                              ", already freed (" + i.note + ")");
  }
  if (cudaError_t e = legacyImplicitLocked(s)) return e;
  blockSetFreeQueued(devPtr, true);
  // Graph memory left live by a launch goes back to its graph (Reserved), not to the quarantine.
  const BlockState to = i.kind == BlockKind::Graph ? BlockState::Reserved : BlockState::Freed;
  const std::string note = "freed by cudaFreeAsync on " + s->name();
  Item item;
  item.what = "cudaFreeAsync";
  item.delay = false;  // freed as early as the stream allows: late users on other streams show
  item.skipWhenLost = false;
  item.fn = [devPtr, to, note] { blockSetState(devPtr, to, note); };
  submit(s, std::move(item));
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (!ptr) return setLastError(cudaErrorInvalidValue);
  *ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (cudaError_t e = refuseUnsafeLocked("cudaMallocHost")) return e;
  }
  if (size == 0) return cudaSuccess;
  void* p = blockCreate(size, currentDevice(), BlockKind::Pinned, BlockState::Live, PoolKind::None, nullptr,
                        "cudaMallocHost");
  if (!p) return setLastError(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int /*flags*/) { return cudaMallocHost(pHost, size); }

cudaError_t cudaFreeHost(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (cudaError_t e = refuseUnsafeLocked("cudaFreeHost")) return e;
  }
  if (!ptr) return cudaSuccess;
  BlockInfo i;
  if (!blockAt(ptr, &i) || i.kind != BlockKind::Pinned || i.state != BlockState::Live) {
    return failWhy(cudaErrorInvalidValue, "cudaFreeHost of " + hexPtr(ptr) + ", not a live cudaMallocHost buffer");
  }
  synchronizeAll(-1);  // cudaFreeHost synchronises with the devices
  blockSetState(ptr, BlockState::Freed, "freed by cudaFreeHost");
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  if (!memPool) return setLastError(cudaErrorInvalidValue);
  if (cudaError_t e = deviceCheck(device)) return e;
  std::lock_guard<std::mutex> lock(stateMutex());
  *memPool = defaultPoolLocked(device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  if (!memPool) return setLastError(cudaErrorInvalidValue);
  if (cudaError_t e = deviceCheck(device)) return e;
  std::lock_guard<std::mutex> lock(stateMutex());
  *memPool = currentPoolLocked(device);
  return cudaSuccess;
}

cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  if (cudaError_t e = deviceCheck(device)) return e;
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!pools().live.count(memPool) || memPool->dev != device) return setLastError(cudaErrorInvalidValue);
  if (memPool != defaultPoolLocked(device)) pools().defaultModified[device] |= 2;
  pools().current[device] = memPool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps* poolProps) {
  if (!memPool || !poolProps) return setLastError(cudaErrorInvalidValue);
  if (poolProps->allocType != cudaMemAllocationTypePinned ||
      poolProps->location.type != cudaMemLocationTypeDevice) {
    return failWhy(cudaErrorInvalidValue, "cudaMemPoolCreate: only pinned pools of a device are emulated");
  }
  const int dev = poolProps->location.id;
  if (deviceError(dev) != cudaSuccess) return setLastError(cudaErrorInvalidValue);
  if (cudaError_t e = checkSticky(dev)) return e;
  auto* pool = new CUmemPoolHandle_st;
  pool->dev = dev;
  std::lock_guard<std::mutex> lock(stateMutex());
  pools().live.insert(pool);
  *memPool = pool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  std::lock_guard<std::mutex> lock(stateMutex());
  Pools& p = pools();
  if (!p.live.count(memPool) || memPool->isDefault) return setLastError(cudaErrorInvalidValue);
  if (p.current[memPool->dev] == memPool) p.current[memPool->dev] = nullptr;
  // Outstanding allocations stay valid (the runtime releases the pool once they are freed); the
  // handle is kept so that their records stay meaningful.
  p.live.erase(memPool);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  if (!value) return setLastError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!pools().live.count(memPool)) return setLastError(cudaErrorInvalidValue);
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      memPool->reuse[attr - 1] = *static_cast<int*>(value);
      break;
    case cudaMemPoolAttrReleaseThreshold: memPool->releaseThreshold = *static_cast<uint64_t*>(value); break;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh:
      if (*static_cast<uint64_t*>(value) != 0) return setLastError(cudaErrorInvalidValue);  // may only reset
      memPool->usedHigh = 0;
      break;
    default: return setLastError(cudaErrorInvalidValue);
  }
  if (memPool->isDefault) pools().defaultModified[memPool->dev] |= 1;
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
  if (!value) return setLastError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!pools().live.count(memPool)) return setLastError(cudaErrorInvalidValue);
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      *static_cast<int*>(value) = memPool->reuse[attr - 1];
      break;
    case cudaMemPoolAttrReleaseThreshold: *static_cast<uint64_t*>(value) = memPool->releaseThreshold; break;
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrUsedMemCurrent: *static_cast<uint64_t*>(value) = liveBytes(memPool->dev, memPool); break;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh: *static_cast<uint64_t*>(value) = memPool->usedHigh; break;
    default: return setLastError(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t /*minBytesToKeep*/) {
  std::lock_guard<std::mutex> lock(stateMutex());
  return pools().live.count(memPool) ? cudaSuccess : setLastError(cudaErrorInvalidValue);
}

// ---- test hooks about pools (hooks.cpp documents them) ----

__attribute__((visibility("default"))) int cxemu_test_default_pool_modified(int dev) {
  if (dev < 0 || dev >= kMaxDevices) return -1;
  std::lock_guard<std::mutex> lock(stateMutex());
  return pools().defaultModified[dev];
}

__attribute__((visibility("default"))) int cxemu_test_allocation_pool(const void* ptr) {
  BlockInfo i;
  if (!blockContaining(ptr, &i) || i.kind == BlockKind::Pinned) return -1;
  switch (i.pool) {
    case PoolKind::None: return 0;
    case PoolKind::Default: return 1;
    case PoolKind::Created: return 2;
  }
  return -1;
}

}  // extern "C"
