// cx.Tensor, cx.manual_seed and the BLAS thread controls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

#include "cyxwiz/common/error.h"
#include "cyxwiz/ddp/wire.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/random.h"
#include "cyxwiz/tensor/tensor.h"
#include "dlpack.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using cyxwiz::Device;
using cyxwiz::DType;
using cyxwiz::Tensor;
using cyxwiz::bindings::toNumpy;

namespace {

DType sixteenBitDtype(const std::string& dtype, const char* who) {
  CYX_CHECK(dtype == "bfloat16" || dtype == "float16", who, ": dtype must be \"float16\" or \"bfloat16\", got \"",
            dtype, "\"");
  return dtype == "bfloat16" ? DType::BFloat16 : DType::Float16;
}

Device sixteenBitDevice(const std::string& device, const char* who) {
  const Device d = cyxwiz::device::parseDevice(device);
  cyxwiz::device::requireDevice(d, who);
  return d;
}

}  // namespace

void init_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), R"pbdoc(
A contiguous n-dimensional array owned by the engine (float32, float64, int32 or int64; other
numeric arrays are converted to float32).

``cx.Tensor(array)`` wraps a C-contiguous numpy array without copying (other layouts are
converted once); ``numpy.asarray(t)``, ``memoryview(t)`` and ``t.numpy()`` are views, not copies.
)pbdoc")
      .def_buffer([](Tensor& t) {
        if (t.isCuda()) throw cyxwiz::Error("this tensor is on " + t.device().str() + ": copy it to the host with t.numpy()");
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
      .def("numpy", [](const Tensor& t) { return toNumpy(t); },
           "A numpy view of the same memory; for a GPU tensor, a copy on the host.")
      .def("__array__", [](const Tensor& t, py::args, py::kwargs) { return toNumpy(t); })
      .def_property_readonly("is_cuda", &Tensor::isCuda)
      .def("to", [](const Tensor& t, const std::string& device) {
        cyxwiz::Device d = cyxwiz::device::parseDevice(device);
        cyxwiz::device::requireDevice(d, "Tensor.to");
        cyxwiz::bindings::BlockingCall unlocked;
        return t.to(d);
      }, py::arg("device"), "This tensor on \"cpu\", \"cuda\" or \"cuda:N\" (itself when already there).")
      .def("cpu", [](const Tensor& t) {
        cyxwiz::bindings::BlockingCall unlocked;
        return t.to(cyxwiz::Device{});
      })
      .def_property_readonly("__cuda_array_interface__", [](const Tensor& t) {
        // Absent (AttributeError) on host tensors, so consumers fall back to the buffer protocol.
        if (!t.isCuda()) throw py::attribute_error("a host tensor has no __cuda_array_interface__; use numpy()");
        py::dict d;
        d["shape"] = py::tuple(py::cast(t.shape()));
        d["typestr"] = cyxwiz::bindings::numpyDType(t.dtype()).attr("str");
        d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(t.rawData()), false);
        d["version"] = 3;
        d["strides"] = py::none();
        // Our kernels run on a stream of our own; consumers must not race them.
        {
          cyxwiz::bindings::BlockingCall unlocked;
          CYX_CUDA(synchronize(t.device().index));
        }
        d["stream"] = py::none();
        return d;
      })
      .def("__dlpack__", [](const Tensor& t, py::object stream, py::object maxVersion, py::object dlDevice,
                            py::object copy) {
        // stream: the consumer's; pycyxwiz waits for its own kernels at export, and orders the release
        // after the consumer's stream (toDLPack). None: the legacy default stream (1), as the DLPack spec
        // says. -1: the consumer asks for no synchronisation. max_version: the unversioned capsule is
        // what every consumer of the array API standard still accepts.
        (void)maxVersion;
        uintptr_t consumerStream = 1;
        if (t.isCuda() && !stream.is_none()) {
          const auto s = stream.cast<int64_t>();
          CYX_CHECK(s == -1 || s > 0, "__dlpack__: stream=", s, " is not a CUDA stream (-1, 1, 2 or a cudaStream_t)");
          consumerStream = s == -1 ? 0 : static_cast<uintptr_t>(s);
        }
        if (!dlDevice.is_none() && !dlDevice.cast<py::tuple>().equal(cyxwiz::bindings::dlpackDevice(t))) {
          throw py::buffer_error("__dlpack__: this tensor is on " + t.device().str() +
                                 " and is not copied to another device; move it with t.to(...) first");
        }
        const bool copied = !copy.is_none() && copy.cast<bool>();
        return cyxwiz::bindings::toDLPack(copied ? t.clone() : t, consumerStream);
      }, py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
         py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
         "DLPack export (numpy.from_dlpack, torch.from_dlpack, ...): the same memory, no copy.")
      .def("__dlpack_device__", &cyxwiz::bindings::dlpackDevice)
      .def("__len__", [](const Tensor& t) { return t.dim() ? t.size(0) : 0; })
      .def("__repr__", [](const Tensor& t) {
        return "Tensor(shape=" + cyxwiz::shapeString(t.shape()) + ", dtype=" + cyxwiz::dtypeName(t.dtype()) +
               ", device=" + t.device().str() + ")";
      });

  m.def("from_dlpack", [](py::handle obj) { return cyxwiz::bindings::fromDLPack(obj, "from_dlpack"); }, py::arg("x"),
        "A cx.Tensor over the memory of any DLPack producer (numpy, torch, CuPy, JAX), host or GPU, without a copy.");
  m.def("manual_seed", [](uint64_t seed) { cyxwiz::manualSeed(seed); }, py::arg("seed"),
        "Seed the engine's random stream (weight initialisation, dropout masks).");
  m.def("get_rng_state", []() { return py::bytes(cyxwiz::generatorState()); },
        "The engine's random stream state, for checkpoints: restore it with set_rng_state.");
  m.def("set_rng_state", [](const py::bytes& state) { cyxwiz::setGeneratorState(state); }, py::arg("state"));
  // For tests against numpy's float16 and torch's bfloat16: the conversions the collectives use, and
  // DDP's gradient exchange (ddp/wire.h) on "cpu" or a GPU ("cuda:N": the conversion kernels).
  m.def("_round_to_16", [](py::array_t<float, py::array::c_style | py::array::forcecast> x, const std::string& dtype,
                           float scale, const std::string& device) {
    const Device where = sixteenBitDevice(device, "_round_to_16");
    Tensor wide = Tensor::empty({static_cast<int64_t>(x.size())}, DType::Float32);
    std::copy_n(x.data(), x.size(), wide.data<float>());
    Tensor narrow = Tensor::empty({wide.numel()}, sixteenBitDtype(dtype, "_round_to_16"), where);
    cyxwiz::ddp::narrowGradients(wide.to(where), narrow, scale);
    const Tensor host = narrow.to(Device{});
    py::array_t<uint16_t> out(x.size());
    std::memcpy(out.mutable_data(), host.rawData(), host.nbytes());
    return out;
  }, py::arg("x"), py::arg("dtype"), py::arg("scale") = 1.0f, py::arg("device") = "cpu");
  m.def("_widen_16", [](py::array_t<uint16_t, py::array::c_style | py::array::forcecast> bits, const std::string& dtype,
                        const std::string& device) {
    const Device where = sixteenBitDevice(device, "_widen_16");
    Tensor narrow = Tensor::empty({static_cast<int64_t>(bits.size())}, sixteenBitDtype(dtype, "_widen_16"));
    std::memcpy(narrow.rawData(), bits.data(), narrow.nbytes());
    Tensor wide = Tensor::empty({narrow.numel()}, DType::Float32, where);
    cyxwiz::ddp::widenGradients(narrow.to(where), wide, 0, wide.numel());
    const Tensor host = wide.to(Device{});
    py::array_t<float> out(bits.size());
    std::memcpy(out.mutable_data(), host.rawData(), host.nbytes());
    return out;
  }, py::arg("bits"), py::arg("dtype"), py::arg("device") = "cpu");
  m.def("set_num_threads", &cyxwiz::blas::setNumThreads, py::arg("n"),
        "Number of BLAS threads for matrix products in this process.");
  m.def("get_num_threads", &cyxwiz::blas::numThreads, "Number of BLAS threads in this process.");
}
