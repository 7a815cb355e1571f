// cx.Tensor, cx.manual_seed and the BLAS thread controls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/random.h"
#include "cyxwiz/tensor/tensor.h"
#include "numpy_convert.h"

namespace py = pybind11;
using cyxwiz::Tensor;
using cyxwiz::bindings::toNumpy;

void init_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), R"pbdoc(
A contiguous n-dimensional array owned by the engine (float32, float64, int32 or int64).

``cx.Tensor(array)`` wraps a C-contiguous numpy array without copying (other layouts are
converted once); ``numpy.asarray(t)``, ``memoryview(t)`` and ``t.numpy()`` are views, not copies.
)pbdoc")
      .def_buffer([](Tensor& t) {
        const auto item = static_cast<py::ssize_t>(cyxwiz::itemSize(t.dtype()));
        std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
        return py::buffer_info(t.rawData(), item, cyxwiz::bindings::bufferFormat(t.dtype()),
                               static_cast<py::ssize_t>(shape.size()), shape, py::detail::c_strides(shape, item));
      })
      .def(py::init([](py::handle array) { return cyxwiz::bindings::fromNumpyAnyDtype(array, "Tensor"); }), py::arg("array"))
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("dtype", [](const Tensor& t) { return cyxwiz::dtypeName(t.dtype()); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("numpy", [](const Tensor& t) { return toNumpy(t); }, "A numpy view of the same memory.")
      .def("__array__", [](const Tensor& t, py::args, py::kwargs) { return toNumpy(t); })
      .def("__len__", [](const Tensor& t) { return t.dim() ? t.size(0) : 0; })
      .def("__repr__", [](const Tensor& t) {
        return "Tensor(shape=" + cyxwiz::shapeString(t.shape()) + ", dtype=" + cyxwiz::dtypeName(t.dtype()) +
               ", device=" + t.device().str() + ")";
      });

  m.def("manual_seed", [](uint64_t seed) { cyxwiz::manualSeed(seed); }, py::arg("seed"),
        "Seed the engine's random stream (weight initialisation, dropout masks).");
  m.def("get_rng_state", []() { return py::bytes(cyxwiz::generatorState()); },
        "The engine's random stream state, for checkpoints: restore it with set_rng_state.");
  m.def("set_rng_state", [](const py::bytes& state) { cyxwiz::setGeneratorState(state); }, py::arg("state"));
  m.def("set_num_threads", &cyxwiz::blas::setNumThreads, py::arg("n"),
        "Number of BLAS threads for matrix products in this process.");
  m.def("get_num_threads", &cyxwiz::blas::numThreads, "Number of BLAS threads in this process.");
}
