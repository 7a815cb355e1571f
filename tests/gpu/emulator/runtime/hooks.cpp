// TEST DOUBLE, NOT GPU SUPPORT. Test hooks: extern "C" functions exported by the emulator's version
// script (cxemu_test_*), for tests to call through ctypes:
//   void* cxemu_test_foreign_alloc(int dev, size_t bytes)  device memory of "another library" (CuPy,
//       PyTorch...): a live allocation of cuda:dev, filled with 0xFF; nullptr if dev is not a device.
//   int cxemu_test_foreign_release(void* p)  that library frees and reuses it at once: poisoned, and any
//       later access by queued work is an illegal address. 0 on success, -1 if p is not such memory.
//   int cxemu_test_errors()  illegal accesses caught in this process so far.
//   int cxemu_test_sticky_error(int dev)  the device's sticky error (a cudaError_t; 0 when healthy).
//   int cxemu_test_default_pool_modified(int dev)  bit 0: an attribute of the device's default memory
//       pool was set; bit 1: the device's current pool was replaced (cudaDeviceSetMemPool). memory.cpp.
//   int cxemu_test_allocation_pool(const void* p)  where the allocation holding p came from: 0 cudaMalloc
//       (or foreign/graph memory), 1 the device's default pool, 2 a pool made by cudaMemPoolCreate, -1 not
//       device memory. memory.cpp.
//   int cxemu_test_graph_holds(void* owner)  live graphs and graph execs holding `owner` (an ncclComm_t).
//   int cxemu_test_live_graphs()  graphs plus graph execs not destroyed.
//   uintptr_t cxemu_test_stream_read(int dev, const void* p, size_t bytes, int ms)  "another library"
//       reads [p, p+bytes) on a stream of its own (created on cuda:dev), for `ms` milliseconds, queued
//       now; returns that stream (as a DLPack consumer's stream), 0 on failure.
//   int cxemu_test_stream_synchronize(uintptr_t stream)  waits for such a stream (a cudaError_t).
//   int cxemu_test_last_conv_algo(int pass)  the algorithm the last cuDNN convolution call of `pass` (0
//       forward, 1 backward data, 2 backward filter) received, as its enum's value; -1 none yet. cudnn.cpp.
//   int cxemu_test_conv_searches()  cudnnFindConvolution*Algorithm calls so far, refused ones included.
//       cudnn.cpp.
#include <chrono>
#include <thread>

#include "internal.h"

namespace cxemu {
int liveGraphs();  // capture.cpp
}

using namespace cxemu;

extern "C" {

__attribute__((visibility("default"))) void* cxemu_test_foreign_alloc(int dev, size_t bytes) {
  if (deviceError(dev) != cudaSuccess || bytes == 0) return nullptr;
  return blockCreate(bytes, dev, BlockKind::Foreign, BlockState::Live, PoolKind::None, nullptr,
                     "allocated by another library (cxemu_test_foreign_alloc)");
}

__attribute__((visibility("default"))) int cxemu_test_foreign_release(void* p) {
  BlockInfo i;
  if (!blockAt(p, &i) || i.kind != BlockKind::Foreign || i.state != BlockState::Live) return -1;
  blockSetState(p, BlockState::Freed, "released by its library (cxemu_test_foreign_release)");
  return 0;
}

__attribute__((visibility("default"))) int cxemu_test_errors() { return illegalAccessCount(); }

__attribute__((visibility("default"))) int cxemu_test_sticky_error(int dev) { return stickyError(dev); }

__attribute__((visibility("default"))) int cxemu_test_graph_holds(void* owner) { return holds(owner); }

__attribute__((visibility("default"))) int cxemu_test_live_graphs() { return liveGraphs(); }

__attribute__((visibility("default"))) uintptr_t cxemu_test_stream_read(int dev, const void* p, size_t bytes, int ms) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) return 0;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  // Checked before and after the sleep: a free that lands while it reads is caught too.
  if (e == cudaSuccess) {
    e = enqueue(s, "a foreign library's kernel (cxemu_test_stream_read)", {Access{p, bytes, false}},
                [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
  }
  cudaSetDevice(previous);
  return e == cudaSuccess ? reinterpret_cast<uintptr_t>(s) : 0;
}

__attribute__((visibility("default"))) int cxemu_test_stream_synchronize(uintptr_t stream) {
  return cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
}

}  // extern "C"
