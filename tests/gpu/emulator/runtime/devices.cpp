// TEST DOUBLE, NOT GPU SUPPORT. The emulated devices: how many (CYXWIZ_EMULATED_GPUS, default 1,
// 0..64, read once), each a "pycyxwiz host emulator" of capability 9.0 with 80 GiB and 132 SMs, the
// calling thread's current device, versions (runtime and driver 13000), and the identity of each GPU:
// PCI bus id "0000:<0x10+dev>:00.0" and a UUID derived from CYXWIZ_EMULATED_HOST_ID (default
// "emulated-host") and the index. Two processes with the same host id and index see the same GPU, as
// two containers given the same physical GPU would; a different host id is a different machine.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "internal.h"

namespace cxemu {

namespace {

thread_local int tDevice = 0;

struct CountSetting {
  int count = 1;
  bool valid = true;
};

const CountSetting& countSetting() {
  static const CountSetting setting = [] {
    CountSetting s;
    const char* env = std::getenv("CYXWIZ_EMULATED_GPUS");
    if (!env || !*env) return s;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(env, &end, 10);
    if (errno || *end || v < 0 || v > kMaxDevices) {
      s.count = 0;
      s.valid = false;
      return s;
    }
    s.count = static_cast<int>(v);
    return s;
  }();
  return setting;
}

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

int deviceCountSetting(bool* valid) {
  const CountSetting& s = countSetting();
  if (valid) *valid = s.valid;
  return s.count;
}

int deviceCount() { return countSetting().count; }

cudaError_t deviceError(int dev) {
  if (!countSetting().valid) return cudaErrorInvalidValue;
  if (deviceCount() == 0) return cudaErrorNoDevice;
  return dev >= 0 && dev < deviceCount() ? cudaSuccess : cudaErrorInvalidDevice;
}

int currentDevice() { return tDevice; }

int envInt(const char* name, int fallback, int lo, int hi) {
  const char* env = std::getenv(name);
  if (!env || !*env) return fallback;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (*end || v < lo || v > hi) return fallback;
  return static_cast<int>(v);
}

int syncTimeoutMs() { return envInt("CYXWIZ_EMULATED_SYNC_TIMEOUT_MS", 120000, 1, 1 << 30); }

int maxDelayUs() {
  static const int us = envInt("CYXWIZ_EMULATED_DELAY_US", 2000, 0, 1000000);
  return us;
}

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (!runtimeVersion) return setLastError(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* driverVersion) {
  if (!driverVersion) return setLastError(cudaErrorInvalidValue);
  *driverVersion = 13000;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return setLastError(cudaErrorInvalidValue);
  *count = 0;
  bool valid = true;
  const int n = deviceCountSetting(&valid);
  if (!valid) {
    return failWhy(cudaErrorInvalidValue, std::string("CYXWIZ_EMULATED_GPUS=\"") + std::getenv("CYXWIZ_EMULATED_GPUS") +
                                              "\" is not a device count (0.." + std::to_string(kMaxDevices) + ")");
  }
  if (n == 0) return setLastError(cudaErrorNoDevice);
  *count = n;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  const cudaError_t e = deviceError(device);
  if (e != cudaSuccess) return setLastError(e == cudaErrorInvalidValue ? cudaErrorNoDevice : e);
  tDevice = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return setLastError(cudaErrorInvalidValue);
  if (deviceCount() == 0) return setLastError(cudaErrorNoDevice);
  *device = tDevice;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (!prop) return setLastError(cudaErrorInvalidValue);
  const cudaError_t e = deviceError(device);
  if (e != cudaSuccess) return setLastError(e == cudaErrorInvalidValue ? cudaErrorNoDevice : e);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", "pycyxwiz host emulator");
  const char* host = std::getenv("CYXWIZ_EMULATED_HOST_ID");
  const std::string id = std::string(host && *host ? host : "emulated-host") + '\0' + std::to_string(device);
  const uint64_t h1 = fnv1a(id, 1469598103934665603ull), h2 = fnv1a(id, 0x9e3779b97f4a7c15ull);
  for (int i = 0; i < 8; ++i) {
    prop->uuid.bytes[i] = static_cast<char>(h1 >> (8 * i));
    prop->uuid.bytes[8 + i] = static_cast<char>(h2 >> (8 * i));
  }
  prop->totalGlobalMem = size_t(80) << 30;
  prop->sharedMemPerBlock = 48 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->memPitch = 2147483647;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 << 10;
  prop->major = 9;
  prop->minor = 0;
  prop->textureAlignment = 512;
  prop->texturePitchAlignment = 32;
  prop->multiProcessorCount = 132;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->pciBusID = 0x10 + device;
  prop->pciDeviceID = 0;
  prop->pciDomainID = 0;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = 5120;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->streamPrioritiesSupported = 1;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerMultiprocessor = 65536;
  prop->managedMemory = 1;
  prop->concurrentManagedAccess = 1;
  prop->cooperativeLaunch = 1;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->memoryPoolsSupported = 1;
  prop->memoryPoolSupportedHandleTypes = cudaMemHandleTypePosixFileDescriptor;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (!pciBusId || len <= 0) return setLastError(cudaErrorInvalidValue);
  const cudaError_t e = deviceError(device);
  if (e != cudaSuccess) return setLastError(e == cudaErrorInvalidValue ? cudaErrorNoDevice : e);
  // NVIDIA's format, 13 characters (the runtime writes at most len bytes, terminated).
  std::snprintf(pciBusId, static_cast<size_t>(len), "0000:%02x:00.0", 0x10 + device);
  return cudaSuccess;
}

}  // extern "C"
