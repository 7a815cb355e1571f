// The engine's side of the GPU: opens libcyxwiz_cuda.so on first use and turns its statuses into
// exceptions. Nothing here needs CUDA headers, a driver or a GPU until a GPU is asked for.
#pragma once

#include <string>

#include "cyxwiz/cuda/api.h"
#include "cyxwiz/tensor/dtype.h"

namespace cyxwiz::device {

// Whether this build contains the CUDA library, and if not, why (what CMake did not find).
bool cudaBuilt();
std::string cudaBuildNote();

// The loaded library, or null with `*why` saying what is missing: the build, the library's
// dependencies (cuBLAS, NCCL), the driver or a GPU. Cached after the first call.
cuda::Api* tryCudaApi(std::string* why = nullptr);
// Usable GPUs now (0 when unavailable), and the reason when there are none.
int cudaDeviceCount(std::string* why = nullptr);

// The library, or an error that says which part is missing and what to do.
cuda::Api& cudaApi();
// Throws unless `device` is the CPU or a visible GPU; `who` names the caller ("model.to").
void requireDevice(const Device& device, const std::string& who);
// "cpu", "cuda", "cuda:1" (case-insensitive); anything else is an InvalidArgument.
Device parseDevice(const std::string& text);

// Throws cyxwiz::Error with the library's message unless `status` is empty.
void check(const cuda::Status& status);

}  // namespace cyxwiz::device

// Calls one Api method and throws on failure: CYX_CUDA(gemm(dev, ...)).
#define CYX_CUDA(call) ::cyxwiz::device::check(::cyxwiz::device::cudaApi().call)
