// TEST DOUBLE CHECK. Self-test of the emulated NCCL (tests/gpu/emulator/nccl) on the emulated runtime,
// through the public CUDA/NCCL API only. Build and run from the repository root:
//   g++ -std=c++17 -O1 -g -pthread -Itests/gpu/emulator/include -Itests/gpu/emulator -Icpp
//     tests/gpu/emulator/selftest/nccl_selftest.cpp tests/gpu/emulator/runtime/*.cpp
//     tests/gpu/emulator/nccl/*.cpp -lrt -o build/emulator/nccl_selftest && build/emulator/nccl_selftest
// Prints one line per check and "nccl selftest: OK" (exit 0), or the failures (exit 1).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

extern "C" int cxemu_test_nccl_misuse();
// Holds the emulated NCCL's deferred work, so that "right after" checks do not race it on a loaded machine.
extern "C" void cxemu_test_nccl_hold(int on);

namespace {

using Clock = std::chrono::steady_clock;
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

ncclResult_t state(ncclComm_t c) {
  ncclResult_t st = ncclInternalError;
  if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInternalError;
  return st;
}

// Polls the asynchronous state until it leaves ncclInProgress or `ms` pass.
ncclResult_t await(ncclComm_t c, int ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  ncclResult_t st;
  while ((st = state(c)) == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return st;
}

ncclComm_t makeComm(int blocking) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) return nullptr;
  return await(c, 2000) == ncclSuccess ? c : nullptr;
}

float* deviceFloats(const std::vector<float>& host, cudaStream_t s) {
  void* p = nullptr;
  if (cudaMalloc(&p, host.size() * sizeof(float)) != cudaSuccess) return nullptr;
  cudaMemcpyAsync(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, s);
  cudaStreamSynchronize(s);
  return static_cast<float*>(p);
}

std::vector<float> hostFloats(const float* dev, size_t n, cudaStream_t s) {
  std::vector<float> out(n);
  cudaMemcpyAsync(out.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  return out;
}

void initAndAllReduce(cudaStream_t s) {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = nullptr;
  cxemu_test_nccl_hold(1);
  check(ncclCommInitRankConfig(&c, 1, id, 0, &cfg) == ncclInProgress, "non-blocking init returns ncclInProgress");
  check(state(c) == ncclInProgress, "the state is ncclInProgress right after init");
  float* a = deviceFloats({1, 2, 3, 4}, s);
  float* b = deviceFloats({0, 0, 0, 0}, s);
  check(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument,
        "a collective during init: ncclInvalidArgument (NCCL's ncclCommEnsureReady)");
  cxemu_test_nccl_hold(0);
  check(await(c, 2000) == ncclSuccess, "init completes (ncclSuccess)");
  int n = 0, dev = -1, rank = -1;
  check(ncclCommCount(c, &n) == ncclSuccess && n == 1, "ncclCommCount");
  check(ncclCommCuDevice(c, &dev) == ncclSuccess && dev == 0, "ncclCommCuDevice");
  check(ncclCommUserRank(c, &rank) == ncclSuccess && rank == 0, "ncclCommUserRank");

  cxemu_test_nccl_hold(1);
  check(ncclAllReduce(a, b, 4, ncclFloat32, ncclAvg, c, s) == ncclInProgress, "allreduce returns ncclInProgress");
  check(state(c) == ncclInProgress, "the state is ncclInProgress right after the allreduce");
  cudaStreamSynchronize(s);  // the collective is not on the stream yet
  check(hostFloats(b, 4, s) == std::vector<float>({0, 0, 0, 0}), "a sync before ncclSuccess misses the collective");
  cxemu_test_nccl_hold(0);
  check(await(c, 2000) == ncclSuccess, "the allreduce is enqueued (ncclSuccess)");
  check(hostFloats(b, 4, s) == std::vector<float>({1, 2, 3, 4}), "1-rank allreduce (avg) copies send to recv");
  check(ncclCommFinalize(c) == ncclInProgress, "finalize returns ncclInProgress");
  check(await(c, 2000) == ncclSuccess, "finalize completes without graphs");
  check(ncclCommDestroy(c) == ncclSuccess, "destroy after finalize");
  cudaFree(a);
  cudaFree(b);
}

// Captures one allreduce of `c` on `s` into an instantiated graph.
bool captureAllReduce(ncclComm_t c, cudaStream_t s, float* a, float* b, cudaGraph_t* g, cudaGraphExec_t* exec) {
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return false;
  const ncclResult_t r = ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, s);
  const bool queued = (r == ncclSuccess || r == ncclInProgress) && await(c, 2000) == ncclSuccess;
  if (cudaStreamEndCapture(s, g) != cudaSuccess || !queued) return false;
  return cudaGraphInstantiate(exec, *g, 0) == cudaSuccess;
}

void finalizeWaitsForGraphs(cudaStream_t s) {
  ncclComm_t c = makeComm(0);
  check(c != nullptr, "comm for the graph test");
  if (!c) return;
  float* a = deviceFloats({5, 6, 7, 8}, s);
  float* b = deviceFloats({0, 0, 0, 0}, s);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(captureAllReduce(c, s, a, b, &g, &exec), "capture an allreduce");
  check(hostFloats(b, 4, s) == std::vector<float>({0, 0, 0, 0}), "the captured allreduce did not run");
  check(cudaGraphLaunch(exec, s) == cudaSuccess, "graph launch");
  check(hostFloats(b, 4, s) == std::vector<float>({5, 6, 7, 8}), "the replay ran the allreduce");
  check(ncclCommFinalize(c) == ncclInProgress, "finalize with a graph alive returns ncclInProgress");
  check(await(c, 300) == ncclInProgress, "... and stays in progress while the graph lives");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  check(await(c, 2000) == ncclSuccess, "... and completes once the graph is destroyed");
  check(ncclCommDestroy(c) == ncclSuccess, "destroy");
  cudaFree(a);
  cudaFree(b);
}

void abortJoinsFinalize(cudaStream_t s) {
  ncclComm_t c = makeComm(0);
  check(c != nullptr, "comm for the abort test");
  if (!c) return;
  float* a = deviceFloats({1, 1, 1, 1}, s);
  float* b = deviceFloats({0, 0, 0, 0}, s);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(captureAllReduce(c, s, a, b, &g, &exec), "capture an allreduce (abort test)");
  check(ncclCommFinalize(c) == ncclInProgress, "finalize (abort test)");
  std::atomic<bool> returned{false};
  std::thread t([&] {
    ncclCommAbort(c);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  check(!returned, "abort joins the finalize that waits for the graph (NCCL >= 2.26)");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  t.join();
  check(returned, "abort returns once the graph is destroyed");
  cudaFree(a);
  cudaFree(b);
}

void hangUntilAbort(cudaStream_t s) {
  setenv("CYXWIZ_EMULATED_NCCL_HANG", "1", 1);
  ncclComm_t c = makeComm(0);
  float* a = deviceFloats({1, 1, 1, 1}, s);
  check(c && ncclAllReduce(a, a, 4, ncclFloat32, ncclSum, c, s) == ncclInProgress, "hung allreduce accepted");
  check(await(c, 2000) == ncclSuccess, "hung allreduce enqueued");
  cudaEvent_t ev = nullptr;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cudaEventRecord(ev, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  check(cudaEventQuery(ev) == cudaErrorNotReady, "an event after the hung collective stays incomplete");
  cudaGetLastError();
  unsetenv("CYXWIZ_EMULATED_NCCL_HANG");
  check(ncclCommAbort(c) == ncclSuccess, "abort of a hung communicator returns");
  check(cudaStreamSynchronize(s) == cudaSuccess, "after the abort the stream drains");
  check(cudaEventQuery(ev) == cudaSuccess, "... and the event completes");
  cudaEventDestroy(ev);
  cudaFree(a);
}

void concurrentUseIsCaught() {
  cudaStream_t s1 = nullptr, s2 = nullptr;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  float* a = deviceFloats({1, 1, 1, 1}, s1);
  float* b = deviceFloats({0, 0, 0, 0}, s1);
  const int before = cxemu_test_nccl_misuse();
  for (int i = 0; i < 50 && cxemu_test_nccl_misuse() == before; ++i) {
    ncclComm_t c = makeComm(1);  // blocking: both collectives go on their streams at once
    if (!c) break;
    ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, s1);
    ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, s2);
    cudaStreamSynchronize(s1);
    cudaStreamSynchronize(s2);
    if (cxemu_test_nccl_misuse() != before) check(state(c) == ncclInvalidUsage, "misuse sets ncclInvalidUsage");
    ncclCommAbort(c);
  }
  check(cxemu_test_nccl_misuse() > before, "two streams running collectives of one comm at once are caught");
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

}  // namespace

int main() {
  cudaSetDevice(0);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  initAndAllReduce(s);
  finalizeWaitsForGraphs(s);
  abortJoinsFinalize(s);
  hangUntilAbort(s);
  concurrentUseIsCaught();
  cudaStreamDestroy(s);
  if (failures) {
    std::printf("nccl selftest: %d FAILED\n", failures);
    return 1;
  }
  std::printf("nccl selftest: OK\n");
  return 0;
}
