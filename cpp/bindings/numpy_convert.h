// numpy <-> Tensor at the Python boundary. No copies where the layout allows it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "cyxwiz/nn/optimizer.h"
#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::bindings {

namespace py = pybind11;

// float32 C-contiguous arrays (and cx.Tensor) are wrapped without a copy; any other numeric array
// (float64 inputs, uint8 images, strided views) is converted to float32 once.
Tensor floatTensor(py::handle obj, const char* what);
// A model's input: integer arrays as int64 when the model's first layer takes token ids (indices),
// everything else as floatTensor.
Tensor modelInput(py::handle obj, bool indices, const char* what);
// Class indices from any integer dtype -> int64 ((N,), or (N, T) for sequences); a 1-D float array only
// when every value is an exact integer (labels are never silently truncated); a float array of 2 or more
// dimensions -> float32 rows (one-hot/probabilities).
Tensor targetTensor(py::handle obj, const char* what);
// A loss target: targetTensor when the loss takes class indices, else floatTensor (regression values).
Tensor lossTargetTensor(bool classIndices, py::handle obj, const char* what);
// A numpy array over the tensor's storage (writable view; keeps the storage alive). None when undefined.
py::object toNumpy(const Tensor& t);  // a view of host memory; a copy of a GPU tensor
// What a forward/backward hands back: numpy for host tensors, the cx.Tensor itself for GPU ones (no copy).
py::object toPython(const Tensor& t);
// Wraps an object exposing __cuda_array_interface__ (CuPy, PyTorch CUDA tensors) without a copy.
Tensor cudaArrayTensor(py::handle obj, const char* what);
Tensor fromNumpyAnyDtype(py::handle obj, const char* what);
// An array a collective may write into: a numpy array (or cx.Tensor) of float32/float64/float16,
// int64/int32/int16/int8, uint8 or bool, C-contiguous and writable, wrapped without a copy.
// TypeError/ValueError that say how to fix it. `as` (from dtypeOverride): the array holds that
// dtype's bits in 2-byte integers (bfloat16; numpy has none).
Tensor inplaceTensor(py::handle obj, const char* what, std::optional<DType> as = std::nullopt);
// A read-only collective input: as inplaceTensor, but non-contiguous arrays are copied once.
Tensor inputTensor(py::handle obj, const char* what, std::optional<DType> as = std::nullopt);
// A collective's dtype= keyword: None, or "bfloat16".
std::optional<DType> dtypeOverride(py::handle dtype, const char* what);
// Optimizer.state_dict()'s form of an OptimizerState: floats for scalars, arrays for buffers (optim.cpp).
py::dict stateDict(const nn::OptimizerState& state);
// The numpy dtype of a DType; bfloat16 is uint16 (its bits: numpy has no bfloat16).
py::dtype numpyDType(DType dtype);
// A new numpy array of `shape` and the tensor dtype, and a Tensor over it.
std::pair<py::array, Tensor> newArray(const std::vector<py::ssize_t>& shape, DType dtype);
// The buffer-protocol format character of a dtype ("f", "d", ...).
std::string bufferFormat(DType dtype);

}  // namespace cyxwiz::bindings
