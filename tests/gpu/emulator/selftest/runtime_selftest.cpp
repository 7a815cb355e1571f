// TEST DOUBLE, NOT GPU SUPPORT. Self-test of the emulated CUDA runtime (tests/gpu/emulator/runtime):
// asynchronous streams, the per-thread last error, sticky illegal accesses, capture with a cross-stream
// fork/join and replay, invalidation, cuBLAS and cuBLASLt. Linked against the runtime's files only:
//   g++ -std=c++17 -O1 -g -Wall -Wextra -pthread -Itests/gpu/emulator/include -Itests/gpu/emulator -Icpp
//     tests/gpu/emulator/selftest/runtime_selftest.cpp tests/gpu/emulator/runtime/*.cpp -o OUT/runtime_selftest
// Exit status 0 when every check passed; each failure prints its line.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/emu.h"

extern "C" int cxemu_test_errors();
extern "C" int cxemu_test_default_pool_modified(int dev);
extern "C" int cxemu_test_allocation_pool(const void* p);
extern "C" void* cxemu_test_foreign_alloc(int dev, size_t bytes);
extern "C" int cxemu_test_foreign_release(void* p);

namespace {

int gFailures = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++gFailures;                                                         \
    }                                                                      \
  } while (0)

#define CHECK_EQ(a, b)                                                                                        \
  do {                                                                                                        \
    const long long va_ = static_cast<long long>(a), vb_ = static_cast<long long>(b);                         \
    if (va_ != vb_) {                                                                                         \
      std::fprintf(stderr, "FAILED %s:%d: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a, #b, va_, vb_); \
      ++gFailures;                                                                                            \
    }                                                                                                         \
  } while (0)

// A gate the host opens: work queued behind it cannot run before.
struct Gate {
  std::atomic<bool> open{false};
  void wait() const {
    while (!open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

cudaError_t blockOn(cudaStream_t s, Gate* g) { return cxemu::enqueue(s, "gate", {}, [g] { g->wait(); }); }

void testAsyncAndLastError() {
  std::printf("async execution, NotReady and the last error\n");
  CHECK_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* d = nullptr;
  CHECK_EQ(cudaMallocAsync(reinterpret_cast<void**>(&d), 4 * sizeof(float), s), cudaSuccess);
  std::vector<float> host{1, 2, 3, 4}, back(4, 0.0f);
  CHECK_EQ(cudaMemcpyAsync(d, host.data(), 16, cudaMemcpyHostToDevice, s), cudaSuccess);
  host.assign(4, -7.0f);  // pageable source: staged at the call, reusable at once
  Gate gate;
  CHECK_EQ(blockOn(s, &gate), cudaSuccess);
  CHECK_EQ(cxemu::enqueue(s, "double", {{d, 16, true}}, [d] {
             for (int i = 0; i < 4; ++i) d[i] *= 2;
           }),
           cudaSuccess);
  CHECK_EQ(cudaMemcpyAsync(back.data(), d, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
  CHECK(back[0] == 0.0f);  // not yet: the copy is queued behind the gate
  CHECK_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  CHECK_EQ(cudaPeekAtLastError(), cudaErrorNotReady);
  CHECK_EQ(cudaGetLastError(), cudaErrorNotReady);
  CHECK_EQ(cudaGetLastError(), cudaSuccess);  // cleared
  cudaEvent_t ev = nullptr;
  CHECK_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  CHECK_EQ(cudaEventRecord(ev, s), cudaSuccess);
  CHECK_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  CHECK_EQ(cudaGetLastError(), cudaErrorNotReady);
  gate.open = true;
  CHECK_EQ(cudaStreamSynchronize(s), cudaSuccess);
  CHECK_EQ(cudaEventQuery(ev), cudaSuccess);
  CHECK(back[0] == 2.0f && back[3] == 8.0f);
  // A wait across streams: t waits for s's event, recorded behind a closed gate.
  cudaStream_t t = nullptr;
  CHECK_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
  Gate gate2;
  CHECK_EQ(blockOn(s, &gate2), cudaSuccess);
  CHECK_EQ(cudaEventRecord(ev, s), cudaSuccess);
  CHECK_EQ(cudaStreamWaitEvent(t, ev, 0), cudaSuccess);
  std::atomic<bool> ran{false};
  CHECK_EQ(cxemu::enqueue(t, "after", {}, [&ran] { ran = true; }), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(!ran.load());
  CHECK_EQ(cudaStreamQuery(t), cudaErrorNotReady);
  cudaGetLastError();
  gate2.open = true;
  CHECK_EQ(cudaStreamSynchronize(t), cudaSuccess);
  CHECK(ran.load());
  // Kind checks at the call.
  CHECK_EQ(cudaMemcpyAsync(d, host.data(), 16, cudaMemcpyDeviceToHost, s), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  cudaPointerAttributes a{};
  CHECK_EQ(cudaPointerGetAttributes(&a, d + 1), cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice && a.device == 0);
  CHECK_EQ(cudaPointerGetAttributes(&a, host.data()), cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);
  CHECK_EQ(cxemu_test_allocation_pool(d), 1);
  CHECK_EQ(cudaFreeAsync(d, s), cudaSuccess);
  CHECK_EQ(cudaFreeAsync(d, s), cudaErrorInvalidValue);  // double free
  cudaGetLastError();
  CHECK_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaEventDestroy(ev);
  cudaStreamDestroy(t);
  cudaStreamDestroy(s);
}

void testPoolsAndDevices() {
  std::printf("pools, PCI bus ids\n");
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  CHECK_EQ(cudaMemPoolCreate(&pool, &props), cudaSuccess);
  uint64_t threshold = UINT64_MAX;
  CHECK_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), cudaSuccess);
  CHECK_EQ(cxemu_test_default_pool_modified(0), 0);
  void* p = nullptr;
  CHECK_EQ(cudaMallocFromPoolAsync(&p, 64, pool, cudaStreamLegacy), cudaSuccess);
  CHECK_EQ(cxemu_test_allocation_pool(p), 2);
  CHECK_EQ(cudaFreeAsync(p, cudaStreamLegacy), cudaSuccess);
  CHECK_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  cudaMemPool_t def = nullptr;
  CHECK_EQ(cudaDeviceGetDefaultMemPool(&def, 0), cudaSuccess);
  CHECK_EQ(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold), cudaSuccess);
  CHECK_EQ(cxemu_test_default_pool_modified(0), 1);
  CHECK_EQ(cudaMemPoolDestroy(pool), cudaSuccess);
  char bus[32];
  CHECK_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 1), cudaSuccess);
  CHECK(std::strcmp(bus, "0000:11:00.0") == 0);
  cudaDeviceProp p0{}, p1{};
  CHECK_EQ(cudaGetDeviceProperties(&p0, 0), cudaSuccess);
  CHECK_EQ(cudaGetDeviceProperties(&p1, 1), cudaSuccess);
  CHECK(std::memcmp(p0.uuid.bytes, p1.uuid.bytes, 16) != 0);
  CHECK(p0.major == 9 && p0.multiProcessorCount == 132 && std::strcmp(p0.name, "pycyxwiz host emulator") == 0);
  CHECK_EQ(cudaGetDeviceProperties(&p0, 7), cudaErrorInvalidDevice);
  cudaGetLastError();
}

void testCaptureJoinReplay() {
  std::printf("capture: fork/join, graph memory, replay\n");
  cudaStream_t s1 = nullptr, s2 = nullptr;
  CHECK_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  CHECK_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  float* buf = nullptr;
  CHECK_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 2 * sizeof(float)), cudaSuccess);
  CHECK_EQ(cudaMemsetAsync(buf, 0, 8, s1), cudaSuccess);
  CHECK_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);

  CHECK_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  CHECK(cxemu::isCapturing(s1));
  CHECK_EQ(cudaEventRecord(fork, s1), cudaSuccess);
  CHECK_EQ(cudaStreamWaitEvent(s2, fork, 0), cudaSuccess);
  CHECK(cxemu::isCapturing(s2));
  CHECK_EQ(cxemu::enqueue(s2, "add1", {{buf + 1, 4, true}}, [buf] { buf[1] += 1; }), cudaSuccess);
  float* tmp = nullptr;
  CHECK_EQ(cudaMallocAsync(reinterpret_cast<void**>(&tmp), 4, s1), cudaSuccess);
  CHECK(cxemu::isDeviceRange(tmp, 4, 0));
  CHECK_EQ(cxemu::enqueue(s1, "tmp", {{tmp, 4, true}}, [tmp] { tmp[0] = 10; }), cudaSuccess);
  CHECK_EQ(cxemu::enqueue(s1, "add10", {{tmp, 4, false}, {buf, 4, true}}, [tmp, buf] { buf[0] += tmp[0]; }),
           cudaSuccess);
  CHECK_EQ(cudaFreeAsync(tmp, s1), cudaSuccess);
  CHECK_EQ(cudaEventRecord(join, s2), cudaSuccess);
  CHECK_EQ(cudaStreamWaitEvent(s1, join, 0), cudaSuccess);
  CHECK_EQ(cudaEventQuery(join), cudaErrorCapturedEvent);  // invalidates: do it on a copy? no, check below
  cudaGetLastError();
  cudaGraph_t graph = nullptr;
  CHECK_EQ(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  CHECK(graph == nullptr);
  CHECK(!cxemu::isCapturing(s2));

  // Again, without the illegal query.
  CHECK_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaEventRecord(fork, s1);
  cudaStreamWaitEvent(s2, fork, 0);
  cxemu::enqueue(s2, "add1", {{buf + 1, 4, true}}, [buf] { buf[1] += 1; });
  CHECK_EQ(cudaMallocAsync(reinterpret_cast<void**>(&tmp), 4, s1), cudaSuccess);
  cxemu::enqueue(s1, "tmp", {{tmp, 4, true}}, [tmp] { tmp[0] = 10; });
  cxemu::enqueue(s1, "add10", {{tmp, 4, false}, {buf, 4, true}}, [tmp, buf] { buf[0] += tmp[0]; });
  CHECK_EQ(cudaFreeAsync(tmp, s1), cudaSuccess);
  CHECK(!cxemu::isDeviceRange(tmp, 4, 0));
  cudaEventRecord(join, s2);
  cudaStreamWaitEvent(s1, join, 0);
  CHECK_EQ(cudaStreamEndCapture(s1, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  CHECK_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  CHECK_EQ(cudaGraphDestroy(graph), cudaSuccess);
  for (int i = 0; i < 3; ++i) CHECK_EQ(cudaGraphLaunch(exec, s1), cudaSuccess);
  CHECK_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  CHECK(buf[0] == 30.0f && buf[1] == 3.0f);

  // Unjoined: s2 forked and never joined back.
  CHECK_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaEventRecord(fork, s1);
  cudaStreamWaitEvent(s2, fork, 0);
  cxemu::enqueue(s2, "add1", {{buf + 1, 4, true}}, [buf] { buf[1] += 1; });
  void* m = nullptr;
  CHECK_EQ(cudaMalloc(&m, 16), cudaErrorStreamCaptureUnsupported);  // Global mode: unsafe call
  cudaGetLastError();
  CHECK_EQ(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  CHECK_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaEventRecord(fork, s1);
  cudaStreamWaitEvent(s2, fork, 0);
  cxemu::enqueue(s2, "add1", {{buf + 1, 4, true}}, [buf] { buf[1] += 1; });
  CHECK_EQ(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureUnjoined);
  cudaGetLastError();

  // Synchronising a capturing stream is refused and invalidates.
  CHECK_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  CHECK_EQ(cudaStreamSynchronize(s1), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus st{};
  CHECK_EQ(cudaStreamIsCapturing(s1, &st), cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusInvalidated);
  CHECK_EQ(cxemu::enqueue(s1, "late", {}, [] {}), cudaErrorStreamCaptureInvalidated);
  CHECK_EQ(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();

  // A free of memory from outside the capture invalidates it (and frees nothing).
  CHECK_EQ(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  CHECK_EQ(cudaFreeAsync(buf, s1), cudaErrorInvalidValue);
  CHECK_EQ(cudaStreamIsCapturing(s1, &st), cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusInvalidated);
  CHECK_EQ(cudaStreamEndCapture(s1, &graph), cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  cudaGetLastError();
  CHECK(cxemu::isDeviceRange(buf, 8, 0));

  // Replays still fine, and the legacy stream waits for blocking streams only.
  CHECK_EQ(cudaGraphLaunch(exec, s1), cudaSuccess);
  CHECK_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  CHECK(buf[0] == 40.0f && buf[1] == 4.0f);
  CHECK_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  CHECK_EQ(cudaFree(buf), cudaSuccess);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

void testBlas() {
  std::printf("cuBLAS and cuBLASLt\n");
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cublasHandle_t h = nullptr;
  CHECK_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  CHECK_EQ(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
  // Column-major A (2x3), B (3x2): C = A B (2x2).
  const float ha[6] = {1, 4, 2, 5, 3, 6};  // [[1,2,3],[4,5,6]]
  const float hb[6] = {7, 9, 11, 8, 10, 12};  // [[7,8],[9,10],[11,12]]
  float *a, *b, *c;
  cudaMalloc(reinterpret_cast<void**>(&a), 24);
  cudaMalloc(reinterpret_cast<void**>(&b), 24);
  cudaMalloc(reinterpret_cast<void**>(&c), 16);
  cudaMemcpyAsync(a, ha, 24, cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(b, hb, 24, cudaMemcpyHostToDevice, s);
  const float one = 1, zero = 0;
  CHECK_EQ(cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, a, 2, b, 3, &zero, c, 2), CUBLAS_STATUS_SUCCESS);
  CHECK_EQ(cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, a, 1, b, 3, &zero, c, 2),
           CUBLAS_STATUS_INVALID_VALUE);
  float hc[4] = {};
  cudaMemcpyAsync(hc, c, 16, cudaMemcpyDeviceToHost, s);
  CHECK_EQ(cudaStreamSynchronize(s), cudaSuccess);
  CHECK(hc[0] == 58 && hc[1] == 139 && hc[2] == 64 && hc[3] == 154);

  // cuBLASLt: D = op(A) op(B) + bias, ReLU; A = a^T read as 3x2 with TRANSA = T.
  cublasLtHandle_t lt = nullptr;
  CHECK_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t n = CUBLAS_OP_N;
  const uint32_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
  float* bias;
  cudaMalloc(reinterpret_cast<void**>(&bias), 8);
  const float hbias[2] = {-100, 1};
  cudaMemcpyAsync(bias, hbias, 8, cudaMemcpyHostToDevice, s);
  const void* bp = bias;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &n, sizeof n);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 2, 3, 2);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 3, 2, 3);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 2, 2, 2);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t r{};
  int count = 0;
  CHECK_EQ(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &r, &count), CUBLAS_STATUS_SUCCESS);
  CHECK_EQ(count, 1);
  CHECK_EQ(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, c, ld, c, ld, &r.algo, nullptr, 0, s),
           CUBLAS_STATUS_SUCCESS);
  cudaMemcpyAsync(hc, c, 16, cudaMemcpyDeviceToHost, s);
  CHECK_EQ(cudaStreamSynchronize(s), cudaSuccess);
  CHECK(hc[0] == 0 && hc[1] == 140 && hc[2] == 0 && hc[3] == 155);
  const uint32_t gelu = CUBLASLT_EPILOGUE_GELU;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof gelu);
  CHECK_EQ(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &r, &count), CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(bias);
  cudaStreamDestroy(s);
}

// Last: it loses the context of cuda:1 for good.
void testStickyIllegalAccess() {
  std::printf("use after free on another stream: sticky illegal address (cuda:1)\n");
  CHECK_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1 = nullptr, s2 = nullptr;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  void* buf = nullptr;
  CHECK_EQ(cudaMallocAsync(&buf, 64, s1), cudaSuccess);
  CHECK_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  Gate gate;
  blockOn(s2, &gate);
  CHECK_EQ(cxemu::enqueue(s2, "reader", {{buf, 64, false}}, [] {}), cudaSuccess);
  CHECK_EQ(cudaFreeAsync(buf, s1), cudaSuccess);  // s1 does not wait for s2: the bug
  CHECK_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  const int before = cxemu_test_errors();
  gate.open = true;
  CHECK_EQ(cudaStreamSynchronize(s2), cudaErrorIllegalAddress);
  CHECK_EQ(cxemu_test_errors(), before + 1);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // sticky: never cleared
  void* p = nullptr;
  CHECK_EQ(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
  // A foreign allocation released while work still uses it (on cuda:0, still healthy).
  CHECK_EQ(cudaSetDevice(0), cudaSuccess);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // this thread's last error, from cudaMalloc above
  CHECK_EQ(cudaGetLastError(), cudaSuccess);               // cuda:0's context is healthy
  void* foreign = cxemu_test_foreign_alloc(0, 32);
  CHECK(foreign != nullptr);
  cudaPointerAttributes a{};
  cudaPointerGetAttributes(&a, foreign);
  CHECK(a.type == cudaMemoryTypeDevice && a.device == 0);
  cudaStream_t s3 = nullptr;
  cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking);
  Gate gate3;
  blockOn(s3, &gate3);
  cxemu::enqueue(s3, "importer", {{foreign, 32, false}}, [] {});
  CHECK_EQ(cxemu_test_foreign_release(foreign), 0);
  gate3.open = true;
  CHECK_EQ(cudaStreamSynchronize(s3), cudaErrorIllegalAddress);
  CHECK_EQ(cxemu_test_errors(), before + 2);
}

}  // namespace

int main() {
  setenv("CYXWIZ_EMULATED_GPUS", "2", 1);
  setenv("CYXWIZ_EMULATED_DELAY_US", "500", 1);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n != 2) {
    std::fprintf(stderr, "FAILED: cudaGetDeviceCount gave %d\n", n);
    return 1;
  }
  testAsyncAndLastError();
  testPoolsAndDevices();
  testCaptureJoinReplay();
  testBlas();
  testStickyIllegalAccess();
  if (gFailures) {
    std::fprintf(stderr, "%d check(s) FAILED\n", gFailures);
    return 1;
  }
  std::printf("runtime self-test: all checks passed\n");
  return 0;
}
