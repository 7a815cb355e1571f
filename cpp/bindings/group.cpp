// cx.distributed._Group: a CPU process group of its own, beside the one init() makes. It is what
// pycyxwiz.torch builds a torch.distributed backend on: one per torch process group (sub-groups
// included), with rank 0's rendezvous on a free port that the others learn through torch's store.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "cyxwiz/comm/cpu/cpu_backend.h"
#include "gil.h"
#include "numpy_convert.h"
#include "work.h"

namespace py = pybind11;
using namespace cyxwiz;
using namespace cyxwiz::comm;
using cyxwiz::comm::cpu::CpuBackend;
using cyxwiz::bindings::BlockingCall;
using cyxwiz::bindings::dtypeOverride;
using cyxwiz::bindings::finish;
using cyxwiz::bindings::inplaceTensor;
using cyxwiz::bindings::inputTensor;
using cyxwiz::bindings::released;

namespace {

std::shared_ptr<CpuBackend> makeGroup(DistributedConfig config, std::optional<std::function<void(int)>> servedOn) {
  // As init() does: CYXWIZ_SPIN_US, CYXWIZ_RING_SLICE_BYTES and LOCAL_WORLD_SIZE (torchrun sets it;
  // it decides whether a rank may spin) apply to every group too.
  config.readTuning();
  // Port 0 is how rank 0 asks for a free port, which it then tells the others through servedOn.
  DistributedConfig checked = config;
  if (config.rank == 0 && config.masterPort == 0 && servedOn) checked.masterPort = 1;
  checked.validate();
  std::function<void(int)> publish;
  if (servedOn) {
    // Called on this thread inside the released section below: take the GIL back for the callback.
    publish = [&servedOn](int port) {
      py::gil_scoped_acquire gil;
      (*servedOn)(port);
    };
  }
  BlockingCall unlocked;
  return std::make_shared<CpuBackend>(config, publish);
}

}  // namespace

void init_group(py::module_& d) {
  py::class_<CpuBackend, std::shared_ptr<CpuBackend>>(d, "_Group", R"doc(A CPU process group of its own (pycyxwiz.torch).

_Group(config, served_on=None): config.master_port 0 on rank 0 serves the rendezvous on a free port
and calls served_on(port) before waiting for anyone; the other ranks are given that port.

Arrays: numpy float32, float64, float16, int64, int32, int16, int8, uint8 or bool, used in place.
dtype="bfloat16" (numpy has none): the arrays hold bfloat16 bits as int16 or uint16 (from torch:
t.view(torch.int16).numpy()). float16 and bfloat16 are combined in float32 and rounded back at every
step of the ring (as Gloo does), so an N-rank SUM rounds N-1 times.)doc")
      .def(py::init(&makeGroup), py::arg("config"), py::arg("served_on") = py::none())
      .def_property_readonly("rank", &CpuBackend::rank)
      .def_property_readonly("world_size", &CpuBackend::worldSize)
      .def("all_reduce", [](CpuBackend& g, py::object array, ReduceOp op, bool async, py::object dtype) {
        Tensor t = inplaceTensor(array, "all_reduce", dtypeOverride(dtype, "all_reduce"));
        return finish(released([&] { return g.allReduce(t, op, async); }), async, py::none());
      }, py::arg("array"), py::arg("op") = ReduceOp::Sum, py::arg("async_op") = false, py::arg("dtype") = py::none())
      .def("broadcast", [](CpuBackend& g, py::object array, int src, bool async, py::object dtype) {
        Tensor t = inplaceTensor(array, "broadcast", dtypeOverride(dtype, "broadcast"));
        return finish(released([&] { return g.broadcast(t, src, async); }), async, py::none());
      }, py::arg("array"), py::arg("src") = 0, py::arg("async_op") = false, py::arg("dtype") = py::none())
      .def("all_gather", [](CpuBackend& g, py::object in, py::object out, bool async, py::object dtype) {
        const auto as = dtypeOverride(dtype, "all_gather");
        Tensor i = inputTensor(in, "all_gather", as), o = inplaceTensor(out, "all_gather", as);
        return finish(released([&] { return g.allGather(i, o, async); }), async, py::none());
      }, py::arg("array"), py::arg("out"), py::arg("async_op") = false, py::arg("dtype") = py::none(),
         "Every rank's array into `out` (world_size x its elements, rank-major).")
      .def("reduce_scatter", [](CpuBackend& g, py::object in, py::object out, ReduceOp op, bool async, py::object dtype) {
        const auto as = dtypeOverride(dtype, "reduce_scatter");
        Tensor i = inputTensor(in, "reduce_scatter", as), o = inplaceTensor(out, "reduce_scatter", as);
        return finish(released([&] { return g.reduceScatter(i, o, op, async); }), async, py::none());
      }, py::arg("array"), py::arg("out"), py::arg("op") = ReduceOp::Sum, py::arg("async_op") = false,
         py::arg("dtype") = py::none(), "This rank's part of the combined array into `out` (numpy.array_split's parts).")
      .def("barrier", [](CpuBackend& g, bool async) {
        return finish(released([&] { return g.barrier(async); }), async, py::none());
      }, py::arg("async_op") = false)
      .def("gather", [](CpuBackend& g, py::object in, py::object out, int dst, bool async) {
        Tensor i = inputTensor(in, "gather"), o = out.is_none() ? Tensor() : inplaceTensor(out, "gather");
        return finish(released([&] { return g.gather(i, o, dst, async); }), async, py::none());
      }, py::arg("array"), py::arg("out"), py::arg("dst") = 0, py::arg("async_op") = false,
         "Every rank's array into `out` on rank `dst` (world_size x its elements, rank-major; None elsewhere).")
      .def("scatter", [](CpuBackend& g, py::object in, py::object out, int src, bool async) {
        Tensor i = in.is_none() ? Tensor() : inputTensor(in, "scatter"), o = inplaceTensor(out, "scatter");
        return finish(released([&] { return g.scatter(i, o, src, async); }), async, py::none());
      }, py::arg("array"), py::arg("out"), py::arg("src") = 0, py::arg("async_op") = false,
         "Block r of `array` (on rank `src`: world_size x out's elements; None elsewhere) into rank r's `out`.")
      .def("all_to_all", [](CpuBackend& g, py::object in, py::object out, std::vector<int64_t> inCounts,
                            std::vector<int64_t> outCounts, bool async) {
        Tensor i = inputTensor(in, "all_to_all"), o = inplaceTensor(out, "all_to_all");
        return finish(released([&] { return g.allToAll(i, o, inCounts, outCounts, async); }), async, py::none());
      }, py::arg("array"), py::arg("out"), py::arg("in_counts"), py::arg("out_counts"), py::arg("async_op") = false,
         "in_counts[r] elements of `array` (in rank order) to rank r; out_counts[r] from rank r into `out`.")
      .def("send", [](CpuBackend& g, py::object array, int dst, int64_t tag) {
        Tensor t = inputTensor(array, "send");
        return finish(released([&] { return g.send(t, dst, tag); }), true, py::none());
      }, py::arg("array"), py::arg("dst"), py::arg("tag") = 0, "Start sending `array` to rank `dst`: a Work.")
      .def("recv", [](CpuBackend& g, py::object array, int src, int64_t tag) {
        Tensor t = inplaceTensor(array, "recv");
        return finish(released([&] { return g.recv(t, src, tag); }), true, py::none());
      }, py::arg("array"), py::arg("src"), py::arg("tag") = 0,
         "Start receiving into `array` from rank `src` (-1: any rank): a Work; its source_rank once done.")
      .def("shutdown", [](CpuBackend& g) {
        BlockingCall unlocked;
        g.shutdown();
      });
}
