// Status messages for failed CUDA and cuBLAS calls: the call, the device and the library's own
// name and text for the error, so that a user's report says what failed without a debugger.
// (NCCL's helper lives in nccl.cpp, the one file that includes nccl.h.)
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda {

// "cudaMemcpyAsync on cuda:0" (or just the call when no device applies, dev < 0).
inline std::string callOn(const char* call, int dev) {
  std::string s = call;
  if (dev >= 0) s += " on cuda:" + std::to_string(dev);
  return s;
}

// Also clears the calling thread's last-error state, which the runtime sets for every failing call:
// left there, a handled failure (a caught out-of-memory) would resurface at the next unrelated
// kernel launch (launchStatus). Sticky errors survive the clear, as they should.
inline Status cudaFailure(const char* call, int dev, cudaError_t e) {
  cudaGetLastError();
  return callOn(call, dev) + " failed: " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
}

// For a query that answered cudaErrorNotReady: not a failure, but the runtime recorded it as the
// thread's last error, and the next launchStatus would report "device not ready" (PyTorch clears it too).
inline void clearNotReady() { cudaGetLastError(); }

inline Status cublasFailure(const char* call, int dev, cublasStatus_t s) {
  return callOn(call, dev) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")";
}

// Kernel launches report configuration errors (and earlier asynchronous faults) only through
// cudaGetLastError.
inline Status launchStatus(const char* kernel, int dev) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status() : cudaFailure(kernel, dev, e);
}

}  // namespace cyxwiz::cuda

// Returns the failure Status from the enclosing function unless `expr` is cudaSuccess.
#define CX_CUDA_TRY(dev, call, expr)                                                 \
  do {                                                                               \
    cudaError_t cx_err_ = (expr);                                                    \
    if (cx_err_ != cudaSuccess) return ::cyxwiz::cuda::cudaFailure(call, dev, cx_err_); \
  } while (0)

#define CX_CUBLAS_TRY(dev, call, expr)                                                     \
  do {                                                                                     \
    cublasStatus_t cx_st_ = (expr);                                                        \
    if (cx_st_ != CUBLAS_STATUS_SUCCESS) return ::cyxwiz::cuda::cublasFailure(call, dev, cx_st_); \
  } while (0)

// Propagates a non-empty Status.
#define CX_TRY(expr)                          \
  do {                                        \
    ::cyxwiz::cuda::Status cx_s_ = (expr);    \
    if (!cx_s_.empty()) return cx_s_;         \
  } while (0)
