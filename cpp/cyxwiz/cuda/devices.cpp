// Device discovery. None of these needs the per-device state (streams, cuBLAS).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"

namespace cyxwiz::cuda {

Status ApiImpl::deviceCount(int* count) noexcept {
  *count = 0;
  cudaError_t e = cudaGetDeviceCount(count);
  if (e == cudaSuccess) return {};
  *count = 0;
  // This is what a machine without a driver or GPU shows the user, so say what the runtime said
  // and, for "no device", whether CUDA_VISIBLE_DEVICES hides them.
  Status s = cudaFailure("cudaGetDeviceCount", -1, e);
  if (e == cudaErrorInsufficientDriver) {
    // The runtime says "insufficient" also when there is no driver at all; tell the two apart.
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    if (driver == 0) {
      s += ": no NVIDIA driver is loaded (libcuda.so.1 was not found or found no GPU)";
    } else {
      s += ": the driver supports CUDA " + version(driver) + ", this library needs CUDA " + version(runtime);
    }
  } else if (e == cudaErrorNoDevice) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible) s += std::string(" with CUDA_VISIBLE_DEVICES=\"") + visible + "\"";
  }
  return s;
}

Status ApiImpl::driverVersion(int* version) noexcept {
  *version = 0;
  CX_CUDA_TRY(-1, "cudaDriverGetVersion", cudaDriverGetVersion(version));  // 0: no driver
  return {};
}

Status ApiImpl::deviceProperties(int dev, DeviceProperties* out) noexcept {
  cudaDeviceProp p{};
  CX_CUDA_TRY(dev, "cudaGetDeviceProperties", cudaGetDeviceProperties(&p, dev));
  out->name = p.name;
  out->major = p.major;
  out->minor = p.minor;
  out->totalMemory = p.totalGlobalMem;
  out->multiProcessors = p.multiProcessorCount;
  static const char* kHex = "0123456789abcdef";
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    const auto b = static_cast<unsigned char>(p.uuid.bytes[i]);
    uuid += kHex[b >> 4];
    uuid += kHex[b & 15];
  }
  out->uuid = uuid;
  char bus[32] = {0};
  std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
  out->pciBusId = bus;
  return {};
}

Status ApiImpl::pointerDevice(const void* ptr, int* dev) noexcept {
  *dev = -1;
  if (!ptr) return {};
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e == cudaErrorInvalidValue) {
    // Older drivers reject unregistered host memory; that error would otherwise stay sticky for
    // this thread's next cudaGetLastError.
    cudaGetLastError();
    return {};
  }
  if (e != cudaSuccess) return cudaFailure("cudaPointerGetAttributes", -1, e);
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) *dev = a.device;
  return {};
}

}  // namespace cyxwiz::cuda
