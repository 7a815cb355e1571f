// numpy <-> Tensor at the Python boundary. No copies where the layout allows it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::bindings {

namespace py = pybind11;

// float32 C-contiguous arrays (and cx.Tensor) are wrapped without a copy; any other numeric array
// (float64 inputs, uint8 images, strided views) is converted to float32 once.
Tensor floatTensor(py::handle obj, const char* what);
// Class indices from any integer dtype -> int64 (1-D); a 1-D float array only when every value is an
// exact integer (labels are never silently truncated); a 2-D array -> float32 rows (one-hot/probabilities).
Tensor targetTensor(py::handle obj, const char* what);
// A numpy array over the tensor's storage (writable view; keeps the storage alive). None when undefined.
py::object toNumpy(const Tensor& t);
Tensor fromNumpyAnyDtype(py::handle obj, const char* what);
// The buffer-protocol format character of a dtype ("f", "d", ...).
std::string bufferFormat(DType dtype);

}  // namespace cyxwiz::bindings
