// DLPack (https://dmlc.github.io/dlpack/latest/) at the Python boundary: cx.Tensor.__dlpack__ /
// __dlpack_device__ for consumers (numpy.from_dlpack, torch.from_dlpack, cupy.from_dlpack, JAX) and
// cx.from_dlpack for producers, both without copies. The legacy unversioned capsule ("dltensor"),
// which every consumer and producer of the array API standard accepts.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::bindings {

namespace py = pybind11;

// A "dltensor" capsule over the tensor's memory; it keeps the storage alive until the consumer's
// deleter call. For a GPU tensor, waits for the engine's kernels first (consumers read at once), and
// the release is ordered after the work queued on `consumerStream` (__dlpack__'s stream: 1 the legacy
// default stream, 2 the per-thread one, else a cudaStream_t) when the consumer lets go.
py::capsule toDLPack(const Tensor& t, uintptr_t consumerStream = 1);
// (device type, device index) as __dlpack_device__ reports it: (1, 0) host, (2, N) cuda:N.
py::tuple dlpackDevice(const Tensor& t);
// A tensor over the memory of any object with __dlpack__ (C-contiguous float32/float64/int32/int64,
// on the host or a GPU), owning the producer's DLManagedTensor until the tensor's storage goes.
Tensor fromDLPack(py::handle obj, const char* what);

}  // namespace cyxwiz::bindings
