// Drives libcyxwiz_cuda.so (the real one or the host emulator) through its ABI, cyxwiz/cuda/api.h,
// to check behaviour that the Python API reaches only indirectly: the runtime's error state, peer
// copies, graph capture and NCCL finalize. Built and run by tests/gpu/test_api_probe.py and
// tests/gpu/run_on_gpu.sh; needs only g++ (no CUDA headers).
//
//   api_probe LIBRARY CHECK [N]     prints one JSON line, exits 0 when the check passed, 1 when not
//
// Checks: notready (a launch after an event query that answered "not ready"), stream_notready (the
// same with Api::query), oom_then_launch (a launch after a caught out-of-memory), free_in_capture (a
// buffer from before a capture freed inside it), free_error (a free the runtime refuses), peer_copy
// (cuda:0 -> cuda:1 after cuda:0's kernels, then the source freed), finalize_graph (ncclDestroy with
// a graph holding a collective still alive, and after it is destroyed). N sizes the GEMMs that keep
// the GPU busy (default 2048; the emulator wants about 192).
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cyxwiz/cuda/api.h"

using cyxwiz::cuda::Api;
using cyxwiz::cuda::CopyKind;
using cyxwiz::cuda::Status;
using Clock = std::chrono::steady_clock;

namespace {

Api* api = nullptr;
int size = 2048;

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n') ? ' ' : c;
  }
  return out + "\"";
}

[[noreturn]] void finish(bool ok, const std::string& fields) {
  std::printf("{\"ok\": %s, %s}\n", ok ? "true" : "false", fields.c_str());
  std::fflush(stdout);
  std::_Exit(ok ? 0 : 1);
}

void must(const Status& s, const char* what) {
  if (!s.empty()) finish(false, std::string("\"setup\": ") + quoted(std::string(what) + ": " + s));
}

float* deviceFloats(int dev, size_t n, float value) {
  void* p = nullptr;
  must(api->malloc(dev, n * sizeof(float), &p), "malloc");
  must(api->fill(dev, static_cast<float*>(p), static_cast<int64_t>(n), value), "fill");
  return static_cast<float*>(p);
}

// Queues `count` size x size GEMMs on dev's compute stream into c: c = a b with a = b = 1, so every
// element of c ends as `size`.
void busy(int dev, float* a, float* b, float* c, int count) {
  for (int i = 0; i < count; ++i) {
    must(api->gemm(dev, false, false, size, size, size, 1.0f, a, size, b, size, 0.0f, c, size), "gemm");
  }
}

void checkNotReady(bool viaStreamQuery) {
  const size_t n = size_t(size) * size;
  float* a = deviceFloats(0, n, 1.0f);
  float* b = deviceFloats(0, n, 1.0f);
  float* c = deviceFloats(0, n, 0.0f);
  float* y = deviceFloats(0, 1024, 0.0f);
  must(api->synchronize(0), "synchronize");
  busy(0, a, b, c, 8);
  bool done = true;
  if (viaStreamQuery) {
    must(api->query(0, &done), "query");
  } else {
    void* ev = nullptr;
    must(api->recordComputeEvent(0, &ev), "recordComputeEvent");
    must(api->eventQuery(ev, &done), "eventQuery");
    api->eventRelease(ev);
  }
  // A kernel launch right after the "not ready" answer: it must not report that answer as its error.
  Status launch = api->fill(0, y, 1024, 3.0f);
  Status sync = api->synchronize(0);
  float host[1024];
  Status back = api->copy(0, host, y, sizeof host, CopyKind::DeviceToHost);
  const bool values = back.empty() && host[0] == 3.0f && host[1023] == 3.0f;
  finish(!done && launch.empty() && sync.empty() && values,
         std::string("\"not_ready_seen\": ") + (done ? "false" : "true") + ", \"launch\": " + quoted(launch) +
             ", \"synchronize\": " + quoted(sync) + ", \"values\": " + (values ? "true" : "false"));
}

void checkOomThenLaunch() {
  float* y = deviceFloats(0, 1024, 0.0f);
  void* huge = nullptr;
  Status oom = api->malloc(0, size_t(1) << 50, &huge);  // 1 PiB: refused everywhere
  Status launch = api->fill(0, y, 1024, 2.0f);
  Status sync = api->synchronize(0);
  finish(!oom.empty() && launch.empty() && sync.empty(),
         "\"malloc\": " + quoted(oom) + ", \"launch\": " + quoted(launch) + ", \"synchronize\": " + quoted(sync));
}

void checkFreeInCapture() {
  float* before = deviceFloats(0, 4096, 1.0f);
  float* y = deviceFloats(0, 4096, 0.0f);
  must(api->synchronize(0), "synchronize");
  must(api->graphBeginCapture(0), "graphBeginCapture");
  must(api->fill(0, y, 4096, 5.0f), "fill in capture");
  api->free(0, before);  // allocated before the capture
  void* exec = nullptr;
  Status end = api->graphEndCapture(0, &exec);
  if (exec) api->graphDestroy(exec);
  Status after = api->fill(0, y, 4096, 6.0f);
  Status sync = api->synchronize(0);
  const bool named = end.find("allocated before the capture") != std::string::npos;
  finish(named && after.empty() && sync.empty(),
         "\"end_capture\": " + quoted(end) + ", \"launch_after\": " + quoted(after) + ", \"synchronize\": " + quoted(sync));
}

void checkFreeError() {
  float* y = deviceFloats(0, 1024, 0.0f);
  must(api->synchronize(0), "synchronize");
  // Inside the allocation but not its start: the runtime refuses to free it.
  api->free(0, y + 7);
  Status sync = api->synchronize(0);
  Status again = api->synchronize(0);
  finish(sync.find("cudaFreeAsync") != std::string::npos && again.empty(),
         "\"synchronize\": " + quoted(sync) + ", \"again\": " + quoted(again));
}

void checkPeerCopy() {
  int count = 0;
  must(api->deviceCount(&count), "deviceCount");
  if (count < 2) finish(true, "\"skipped\": \"needs two GPUs\"");
  const size_t n = size_t(size) * size;
  float* a = deviceFloats(0, n, 1.0f);
  float* b = deviceFloats(0, n, 1.0f);
  float* c = deviceFloats(0, n, 0.0f);
  float* d = deviceFloats(1, n, -1.0f);
  must(api->synchronize(0), "synchronize 0");
  must(api->synchronize(1), "synchronize 1");
  busy(0, a, b, c, 4);
  Status copy = api->copy(1, d, c, n * sizeof(float), CopyKind::DeviceToDevice);
  api->free(0, c);  // right after the copy, on cuda:0's stream
  std::vector<float> host(n);
  Status back = api->copy(1, host.data(), d, n * sizeof(float), CopyKind::DeviceToHost);
  Status sync0 = api->synchronize(0);
  size_t wrong = 0;
  for (float v : host) wrong += v != float(size);
  finish(copy.empty() && back.empty() && sync0.empty() && wrong == 0,
         "\"copy\": " + quoted(copy) + ", \"copy_back\": " + quoted(back) + ", \"synchronize_source\": " + quoted(sync0) +
             ", \"wrong_values\": " + std::to_string(wrong) + ", \"first\": " + std::to_string(host[0]));
}

void checkFinalizeGraph(double bound) {
  std::string id;
  must(api->ncclUniqueId(&id), "ncclUniqueId");
  void* comm = nullptr;
  must(api->ncclInit(0, 1, 0, id, &comm), "ncclInit");
  for (bool busy = true; busy;) must(api->ncclState(comm, &busy), "ncclState (init)");
  float* x = deviceFloats(0, 1024, 1.0f);
  must(api->synchronize(0), "synchronize");
  must(api->graphBeginCapture(0), "graphBeginCapture");
  must(api->commWaitsForCompute(0), "commWaitsForCompute");
  must(api->ncclCollective(comm, 0, cyxwiz::cuda::CollectiveKind::AllReduce, x, x, 1024,
                           cyxwiz::cuda::ElemType::Float32, cyxwiz::cuda::ReduceKind::Sum, 0),
       "ncclCollective");
  for (bool busy = true; busy;) must(api->ncclState(comm, &busy), "ncclState (collective)");
  void* ev = nullptr;
  must(api->recordCommEvent(0, &ev), "recordCommEvent");
  must(api->computeWaitsFor(0, ev), "computeWaitsFor");
  api->eventRelease(ev);
  void* exec = nullptr;
  must(api->graphEndCapture(0, &exec), "graphEndCapture");
  must(api->graphLaunch(0, exec), "graphLaunch");
  must(api->synchronize(0), "synchronize after replay");
  // What the engine must not do: finalize while the graph is alive. Run it in a thread, bounded.
  const bool graphFirst = std::getenv("PROBE_DESTROY_GRAPH_FIRST") != nullptr;
  if (graphFirst) api->graphDestroy(exec);
  static std::atomic<bool> destroyed{false};
  const auto start = Clock::now();
  std::thread([comm] {
    api->ncclDestroy(comm);
    destroyed = true;
  }).detach();
  for (;;) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string fields = std::string("\"graph_destroyed_first\": ") + (graphFirst ? "true" : "false") +
                               ", \"seconds\": " + std::to_string(elapsed);
    if (destroyed) finish(true, fields);
    // A hang: report it and leave without waiting for the stuck thread.
    if (elapsed > bound) finish(false, fields + ", \"destroy\": \"still running\"");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s LIBRARY CHECK [N]\n", argv[0]);
    return 2;
  }
  if (argc > 3) size = std::atoi(argv[3]);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) finish(false, "\"setup\": " + quoted(std::string("dlopen: ") + dlerror()));
  auto entry = reinterpret_cast<Api* (*)(int, const char**)>(dlsym(lib, "cyxwiz_cuda_api"));
  const char* error = nullptr;
  api = entry ? entry(cyxwiz::cuda::kApiVersion, &error) : nullptr;
  if (!api) finish(false, "\"setup\": " + quoted(error ? error : "no cyxwiz_cuda_api"));
  const std::string check = argv[2];
  if (check == "notready") checkNotReady(false);
  if (check == "stream_notready") checkNotReady(true);
  if (check == "oom_then_launch") checkOomThenLaunch();
  if (check == "free_in_capture") checkFreeInCapture();
  if (check == "free_error") checkFreeError();
  if (check == "peer_copy") checkPeerCopy();
  if (check == "finalize_graph") checkFinalizeGraph(argc > 4 ? std::atof(argv[4]) : 30.0);
  std::fprintf(stderr, "unknown check %s\n", check.c_str());
  return 2;
}
