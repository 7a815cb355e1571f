// TEST DOUBLE, NOT GPU SUPPORT. The runtime's error state, as the CUDA runtime documents it: every
// call that fails records its error as the calling thread's last error (cudaGetLastError returns and
// clears it, cudaPeekAtLastError only returns it), and a sticky error (an illegal address met by
// work on a stream) loses the device's context: every later call on that device returns it and it is
// never cleared.
#include <atomic>
#include <cstdio>
#include <string>

#include "internal.h"

namespace cxemu {

namespace {

thread_local cudaError_t tLastError = cudaSuccess;
std::atomic<int> gSticky[kMaxDevices];  // trivially destructible: safe while workers outlive main
std::atomic<int> gIllegal{0};

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

// NVIDIA's names and texts (cudaGetErrorName / cudaGetErrorString).
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorTimeout, "cudaErrorTimeout", "wait operation timed out"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* find(cudaError_t e) {
  for (const auto& t : kErrors) {
    if (t.code == e) return &t;
  }
  return nullptr;
}

bool validDev(int dev) { return dev >= 0 && dev < kMaxDevices; }

}  // namespace

cudaError_t setLastError(cudaError_t e) {
  if (e != cudaSuccess) tLastError = e;
  return e;
}

void say(const std::string& line) {
  const std::string s = "emulator: " + line + "\n";
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

cudaError_t failWhy(cudaError_t e, const std::string& why) {
  say(why);
  return setLastError(e);
}

std::string hexPtr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

cudaError_t stickyError(int dev) {
  return validDev(dev) ? static_cast<cudaError_t>(gSticky[dev].load(std::memory_order_acquire)) : cudaSuccess;
}

void loseContext(int dev, cudaError_t e, const std::string& why) {
  if (e == cudaErrorIllegalAddress) gIllegal.fetch_add(1);
  say(why);
  if (!validDev(dev)) return;
  int expected = cudaSuccess;
  gSticky[dev].compare_exchange_strong(expected, static_cast<int>(e));
}

int illegalAccessCount() { return gIllegal.load(); }

cudaError_t checkSticky(int dev) {
  const cudaError_t e = stickyError(dev);
  return e == cudaSuccess ? e : setLastError(e);
}

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t sticky = stickyError(currentDevice());
  const cudaError_t e = tLastError;
  tLastError = cudaSuccess;
  return sticky != cudaSuccess ? sticky : e;
}

cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t sticky = stickyError(currentDevice());
  return sticky != cudaSuccess ? sticky : tLastError;
}

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* t = find(error);
  return t ? t->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* t = find(error);
  return t ? t->text : "unrecognized error code";
}

}  // extern "C"
