// CUDA graphs of the compute stream, and the events that order the compute and communication
// streams around collectives.
#include <cuda_runtime_api.h>

#include <vector>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

Status ApiImpl::graphBeginCapture(int dev) noexcept {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  CX_TRY(takePendingError(s));
  // Thread-local: other threads driving other devices may keep making unsafe calls (cudaMalloc...)
  // without invalidating this capture.
  CX_CUDA_TRY(dev, "cudaStreamBeginCapture", cudaStreamBeginCapture(s->compute, cudaStreamCaptureModeThreadLocal));
  std::lock_guard<std::mutex> lock(s->memoryMutex);
  s->capturing = true;
  s->capturedAllocations.clear();
  s->heldFrees.clear();
  return {};
}

bool ApiImpl::capturing(int dev) noexcept {
  DeviceState* s = nullptr;
  if (!useDevice(dev, &s).empty()) return false;
  std::lock_guard<std::mutex> lock(s->memoryMutex);
  return s->capturing;
}

namespace {

// Ends the capture's memory bookkeeping and frees, now outside the capture, what was freed inside it
// but allocated before it. Returns how many there were.
size_t endCaptureFrees(DeviceState* s) {
  std::vector<void*> held;
  {
    std::lock_guard<std::mutex> lock(s->memoryMutex);
    s->capturing = false;
    s->capturedAllocations.clear();
    held.swap(s->heldFrees);
  }
  for (void* p : held) {
    if (cudaFreeAsync(p, s->compute) != cudaSuccess) cudaGetLastError();
  }
  return held.size();
}

}  // namespace

Status ApiImpl::graphEndCapture(int dev, void** graphExec) noexcept {
  *graphExec = nullptr;
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s->compute, &graph);
  const size_t held = endCaptureFrees(s);
  if (ended != cudaSuccess) return cudaFailure("cudaStreamEndCapture", dev, ended);
  if (held) {
    cudaGraphDestroy(graph);
    return "graph capture on cuda:" + std::to_string(dev) + ": " + std::to_string(held) +
           " buffer(s) allocated before the capture were freed inside it; a replay would use freed memory, so the "
           "capture is refused (the buffers were freed after it)";
  }
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is independent of it
  if (e != cudaSuccess) return cudaFailure("cudaGraphInstantiate", dev, e);
  *graphExec = exec;
  return {};
}

Status ApiImpl::graphLaunch(int dev, void* graphExec) noexcept {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  CX_CUDA_TRY(dev, "cudaGraphLaunch", cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphExec), s->compute));
  return {};
}

void ApiImpl::graphDestroy(void* graphExec) noexcept {
  if (graphExec && cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graphExec)) != cudaSuccess) cudaGetLastError();
}

Status ApiImpl::commWaitsForCompute(int dev) noexcept {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  // One event per device suffices: cudaStreamWaitEvent waits for the record made just before it,
  // whatever later records do.
  std::lock_guard<std::mutex> lock(s->mutex);
  CX_CUDA_TRY(dev, "cudaEventRecord", cudaEventRecord(s->computeMark, s->compute));
  CX_CUDA_TRY(dev, "cudaStreamWaitEvent", cudaStreamWaitEvent(s->comm, s->computeMark, 0));
  return {};
}

Status ApiImpl::computeWaitsFor(int dev, void* event) noexcept {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  CX_CUDA_TRY(dev, "cudaStreamWaitEvent", cudaStreamWaitEvent(s->compute, static_cast<cudaEvent_t>(event), 0));
  return {};
}

Status ApiImpl::computeWaitsForStream(int dev, uintptr_t stream) noexcept {
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  cudaEvent_t ev = nullptr;
  CX_CUDA_TRY(dev, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s->compute, ev, 0);
  cudaEventDestroy(ev);  // destroying a recorded event is safe: the wait keeps what it needs
  if (e != cudaSuccess) return cudaFailure("cudaStreamWaitEvent (producer's stream)", dev, e);
  return {};
}

namespace {

// A new event recorded on `stream` of `dev`, for the caller to release.
Status recordEvent(int dev, cudaStream_t DeviceState::*stream, void** event) {
  *event = nullptr;
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  cudaEvent_t ev = nullptr;
  CX_CUDA_TRY(dev, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(ev, s->*stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(ev);
    return cudaFailure("cudaEventRecord", dev, e);
  }
  *event = ev;
  return {};
}

}  // namespace

Status ApiImpl::recordCommEvent(int dev, void** event) noexcept { return recordEvent(dev, &DeviceState::comm, event); }

Status ApiImpl::recordComputeEvent(int dev, void** event) noexcept {
  return recordEvent(dev, &DeviceState::compute, event);
}

Status ApiImpl::eventQuery(void* event, bool* done) noexcept {
  *done = false;
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) {
    clearNotReady();
    return {};
  }
  if (e != cudaSuccess) return cudaFailure("cudaEventQuery", -1, e);
  *done = true;
  return {};
}

void ApiImpl::eventRelease(void* event) noexcept {
  if (event && cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) cudaGetLastError();
}

}  // namespace cyxwiz::cuda
