// Build versions and the exported entry point.
#include "cyxwiz/cuda/api_impl.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <new>

#ifndef CYXWIZ_CUDA_ARCHITECTURES
#define CYXWIZ_CUDA_ARCHITECTURES "unknown"  // built outside cuda.cmake
#endif

namespace cyxwiz::cuda {

int ApiImpl::apiVersion() const noexcept { return kApiVersion; }

// The statically linked runtime's own version rather than CUDART_VERSION: the include path may put
// a newer cuda_runtime_api.h (the cu13 wheel's) ahead of the toolkit whose libcudart_static is linked.
// Needs no driver.
int ApiImpl::cudaRuntimeVersion() const noexcept {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) v = CUDART_VERSION;
  return v;
}

int ApiImpl::ncclVersion() const noexcept { return NCCL_VERSION_CODE; }
int ApiImpl::cublasVersion() const noexcept { return CUBLAS_VERSION; }
const char* ApiImpl::architectures() const noexcept { return CYXWIZ_CUDA_ARCHITECTURES; }

}  // namespace cyxwiz::cuda

// Exported despite -fvisibility=hidden; exports.map keeps it the only dynamic symbol.
extern "C" __attribute__((visibility("default"))) cyxwiz::cuda::Api* cyxwiz_cuda_api(int expectedVersion,
                                                                                    const char** error) {
  if (expectedVersion != cyxwiz::cuda::kApiVersion) {
    static thread_local char message[256];
    std::snprintf(message, sizeof message,
                  "libcyxwiz_cuda.so implements CUDA API version %d but the engine expects version %d: the library "
                  "and the engine were built from different sources; reinstall pycyxwiz",
                  cyxwiz::cuda::kApiVersion, expectedVersion);
    if (error) *error = message;
    return nullptr;
  }
  // Never destroyed: streams and handles must not be torn down after the CUDA runtime at exit.
  static cyxwiz::cuda::ApiImpl* api = new (std::nothrow) cyxwiz::cuda::ApiImpl();
  if (error) *error = api ? nullptr : "out of host memory";
  return api;
}
