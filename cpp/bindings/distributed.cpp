// pycyxwiz._core.distributed: init/finalize, DistributedConfig, collectives on numpy arrays, Work,
// and the DistError family. Conversions and GIL handling only; the logic lives in cyxwiz/comm.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>

#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/sha256.h"
#include "cyxwiz/ddp/sync_batchnorm.h"
#include "gil.h"
#include "work.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz;
using namespace cyxwiz::comm;
using cyxwiz::bindings::BlockingCall;
using cyxwiz::bindings::inplaceTensor;
using cyxwiz::bindings::inputTensor;
using cyxwiz::bindings::newArray;
using cyxwiz::bindings::PyWork;
using cyxwiz::bindings::finish;
using cyxwiz::bindings::finishRecv;
using cyxwiz::bindings::released;
using cyxwiz::bindings::toNumpy;

namespace {

// The process group's lock may be held by init() on another thread (see get_rank below).
std::shared_ptr<Backend> currentBackend(const char* operation) {
  BlockingCall unlocked;
  return backend(operation);
}


void registerExceptions(py::module_& d) {
  auto make = [&](const char* name, py::handle bases, const char* doc) {
    std::string full = std::string("pycyxwiz.distributed.") + name;
    PyObject* type = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr);
    if (type == nullptr) throw py::error_already_set();
    py::object cls = py::reinterpret_steal<py::object>(type);
    d.attr(name) = cls;
    return cls;
  };
  static py::object distError = make("DistError", PyExc_RuntimeError, "A distributed operation failed.");
  static py::object networkError = make("DistNetworkError", py::make_tuple(distError, py::handle(PyExc_ConnectionError)),
                                        "A peer closed or reset its connection, or could not be reached.");
  static py::object timeoutError = make("DistTimeoutError", py::make_tuple(distError, py::handle(PyExc_TimeoutError)),
                                        "A peer went silent past DISTRIBUTED_TIMEOUT_MS.");
  static py::object storeError = make("DistStoreError", py::make_tuple(distError), "The rendezvous refused or lost a request.");
  static py::object backendError = make("DistBackendError", py::make_tuple(distError),
                                        "A collective could not run as called (ranks disagree on it; a backend this build lacks).");
  // Registered after the module-wide translator, so tried before it.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cyxwiz::NetworkError& e) {
      PyErr_SetString(networkError.ptr(), e.what());
    } catch (const cyxwiz::TimeoutError& e) {
      PyErr_SetString(timeoutError.ptr(), e.what());
    } catch (const cyxwiz::StoreError& e) {
      PyErr_SetString(storeError.ptr(), e.what());
    } catch (const cyxwiz::BackendError& e) {
      PyErr_SetString(backendError.ptr(), e.what());
    } catch (const cyxwiz::DistError& e) {
      PyErr_SetString(distError.ptr(), e.what());
    } catch (const cyxwiz::Interrupted&) {
      // The signal handler already raised (KeyboardInterrupt, or the user's own exception).
      if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });
}

std::vector<py::ssize_t> shapeOf(const Tensor& t) { return std::vector<py::ssize_t>(t.shape().begin(), t.shape().end()); }

}  // namespace

// Runs Python's signal handlers from a blocking collective (called about every 100 ms).
static bool pythonSignalPending() {
  py::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

void init_ddp(py::module_& d);
void init_trainer(py::module_& d);
void init_train_step(py::module_& d);
void init_group(py::module_& d);

void init_distributed(py::module_& m) {
  py::module_ d = m.def_submodule("distributed", "Data-parallel communication: init, collectives, errors.");
  registerExceptions(d);
  setInterruptCheck(&pythonSignalPending);

  py::enum_<BackendType>(d, "BackendType", "Which backend carries the collectives.")
      .value("CPU", BackendType::CPU, "TCP ring all-reduce between processes (any platform)")
      .value("NCCL", BackendType::NCCL, "NVIDIA NCCL between GPUs (CUDA builds)");

  py::enum_<ReduceOp>(d, "ReduceOp", "How all_reduce / reduce_scatter combine the ranks' values.")
      .value("SUM", ReduceOp::Sum)
      .value("AVG", ReduceOp::Avg)
      .value("MAX", ReduceOp::Max)
      .value("MIN", ReduceOp::Min)
      .value("PRODUCT", ReduceOp::Product);

  py::class_<DistributedConfig>(d, "DistributedConfig", R"doc(Who this process is in the job and how to reach rank 0.

DistributedConfig() is a world of one; DistributedConfig.from_environment() reads RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, DISTRIBUTED_BACKEND, DISTRIBUTED_TIMEOUT_MS (and the variables
of torchrun, Slurm, Open MPI and MPICH).)doc")
      .def(py::init<>())
      .def_readwrite("rank", &DistributedConfig::rank)
      .def_readwrite("world_size", &DistributedConfig::worldSize)
      .def_readwrite("local_rank", &DistributedConfig::localRank)
      .def_readwrite("master_addr", &DistributedConfig::masterAddr)
      .def_readwrite("master_port", &DistributedConfig::masterPort)
      .def_readwrite("backend", &DistributedConfig::backend)
      .def_readwrite("timeout_ms", &DistributedConfig::timeoutMs)
      .def_readwrite("job_id", &DistributedConfig::jobId)
      .def_readwrite("transport", &DistributedConfig::transport,
                     "CYXWIZ_TRANSPORT: auto, tcp or shm; after init, what the job uses: shm (one host), shm+tcp (shared memory inside hosts, TCP between them) or tcp.")
      .def_readwrite("secret", &DistributedConfig::secret, "Shared secret every rank must prove (CYXWIZ_SECRET); never printed.")
      .def_readonly("source", &DistributedConfig::source)
      .def_static("from_environment", &DistributedConfig::fromEnvironment)
      .def("__repr__", [](const DistributedConfig& c) { return "DistributedConfig(" + c.describe() + ")"; });

  py::class_<PyWork>(d, "Work", "A collective started with async_op=True.")
      .def("wait", &PyWork::wait, py::arg("timeout") = py::none(),
           "Block until done (raising its error); DistTimeoutError if `timeout` seconds pass first. Returns True.")
      .def("is_completed", [](const PyWork& w) { return w.work->isCompleted(); })
      .def("is_success", [](const PyWork& w) { return w.work->isSuccess(); })
      .def("result", [](PyWork& w) {
        w.wait(std::nullopt);
        return w.result;
      }, "Wait, then return what the collective produces (all_gather: list of arrays; reduce_scatter: this rank's part).")
      .def_property_readonly("source_rank", [](const PyWork& w) -> std::optional<int> {
        int r = w.work->sourceRank();
        return r < 0 ? std::nullopt : std::optional<int>(r);
      }, "A completed recv: the rank whose message it took (None otherwise).")
      .def("__repr__", [](const PyWork& w) {
        return "<Work " + w.work->description() + (w.work->isCompleted() ? " completed>" : " pending>");
      });

  d.def("init", [](std::optional<DistributedConfig> config) {
    DistributedConfig c = config ? *config : DistributedConfig::fromEnvironment();
    BlockingCall unlocked;
    init(c);
  }, py::arg("config") = py::none(), "Join the job: from the environment, or from an explicit DistributedConfig.");
  d.def("finalize", &finalize, py::call_guard<BlockingCall>(), "Leave the job (idempotent).");
  // These take the process group's lock, which init() holds through the rendezvous (and init's
  // Ctrl-C check takes the GIL): another thread must wait for it without the GIL.
  d.def("is_initialized", &isInitialized, py::call_guard<BlockingCall>());
  d.def("get_rank", [] { return currentConfig("get_rank").rank; }, py::call_guard<BlockingCall>());
  d.def("get_world_size", [] { return currentConfig("get_world_size").worldSize; }, py::call_guard<BlockingCall>());
  d.def("get_local_rank", [] { return currentConfig("get_local_rank").localRank; }, py::call_guard<BlockingCall>());
  d.def("is_master", [] { return currentConfig("is_master").rank == 0; }, py::call_guard<BlockingCall>());
  d.def("get_config", [] { return currentConfig("get_config"); }, py::call_guard<BlockingCall>(),
        "The DistributedConfig of the current job.");
  d.def("get_backend", [] { return backend("get_backend")->name(); }, py::call_guard<BlockingCall>());
  d.def("convert_sync_batchnorm", [](std::shared_ptr<cyxwiz::nn::SequentialModel> model) {
    cyxwiz::ddp::convertSyncBatchNorm(*model);
    return model;
  }, py::arg("model"), R"doc(
Makes every BatchNorm1DModule/BatchNorm2DModule of the model (inside ResidualModules too) a synchronised
batch norm, as torch.nn.SyncBatchNorm.convert_sync_batchnorm: in training its batch statistics are those
of every rank's rows together (all-reduced in forward and backward), so N ranks of B rows normalise as
one process of N*B rows. Call it on every rank, before DistributedDataParallel. Returns the model.
Without a job of more than one rank the layers use their own rows.)doc");

  d.def("all_reduce", [](py::object array, ReduceOp op, bool async) {
    Tensor t = inplaceTensor(array, "all_reduce");
    return finish(released([&] { return backend("all_reduce")->allReduce(t, op, async); }), async, py::none());
  }, py::arg("array"), py::arg("op") = ReduceOp::Sum, py::arg("async_op") = false,
     "Combine `array` across ranks, in place.");

  d.def("_shared_zeros", [](py::object like) {
    Tensor t = inputTensor(like, "_shared_zeros"), out;
    {
      BlockingCall unlocked;
      out = backend("_shared_zeros")->sharedZeros(t.numel(), t.dtype());
    }
    return toNumpy(out);
  }, py::arg("like"),
     "A zeroed 1-D array of like's size and dtype in memory the ranks of this host share (DDP's buckets): "
     "all_reduce of the whole array reads the peers' copies where they lie. Collective.");

  d.def("broadcast", [](py::object array, int src, bool async) {
    Tensor t = inplaceTensor(array, "broadcast");
    return finish(released([&] { return backend("broadcast")->broadcast(t, src, async); }), async, py::none());
  }, py::arg("array"), py::arg("src") = 0, py::arg("async_op") = false, "Copy rank `src`'s array into every rank's, in place.");

  d.def("all_gather", [](py::object array, bool async) {
    Tensor in = inputTensor(array, "all_gather");
    auto b = currentBackend("all_gather");
    std::vector<py::ssize_t> shape = shapeOf(in);
    shape.insert(shape.begin(), b->worldSize());
    auto [out, outTensor] = newArray(shape, in.dtype());
    py::list parts;
    for (int r = 0; r < b->worldSize(); ++r) parts.append(out[py::int_(r)]);
    return finish(released([&] { return b->allGather(in, outTensor, async); }), async, parts);
  }, py::arg("array"), py::arg("async_op") = false, "Every rank's array, as a list indexed by rank.");

  d.def("reduce_scatter", [](py::object array, ReduceOp op, bool async) {
    Tensor in = inputTensor(array, "reduce_scatter");
    auto b = currentBackend("reduce_scatter");
    int n = b->worldSize(), r = b->rank();
    auto count = static_cast<py::ssize_t>(in.numel());
    py::ssize_t part = count / n + (r < count % n ? 1 : 0);
    auto [out, outTensor] = newArray({part}, in.dtype());
    return finish(released([&] { return b->reduceScatter(in, outTensor, op, async); }), async, out);
  }, py::arg("array"), py::arg("op") = ReduceOp::Sum, py::arg("async_op") = false,
     "Combine across ranks and return this rank's part: numpy.array_split(result.ravel(), world_size)[rank].");

  // For tests against hashlib/hmac: the primitive behind the shared-secret handshake.
  d.def("_hmac_sha256", [](const std::string& key, py::bytes message) {
    std::string m = message;
    Digest mac = hmacSha256(key, m.data(), m.size());
    return py::bytes(reinterpret_cast<const char*>(mac.data()), mac.size());
  });

  d.def("barrier", [](bool async) {
    return finish(released([&] { return backend("barrier")->barrier(async); }), async, py::none());
  }, py::arg("async_op") = false, "Wait until every rank has called barrier().");

  // The facade (distributed/__init__.py) shapes the arrays; `result` is what the call returns.
  d.def("_gather", [](py::object array, py::object out, py::object result, int dst, bool async) {
    Tensor in = inputTensor(array, "gather"), o = out.is_none() ? Tensor() : inplaceTensor(out, "gather");
    return finish(released([&] { return backend("gather")->gather(in, o, dst, async); }), async, result);
  }, py::arg("array"), py::arg("out"), py::arg("result"), py::arg("dst"), py::arg("async_op"));
  d.def("_scatter", [](py::object array, py::object out, int src, bool async) {
    Tensor in = array.is_none() ? Tensor() : inputTensor(array, "scatter"), o = inplaceTensor(out, "scatter");
    return finish(released([&] { return backend("scatter")->scatter(in, o, src, async); }), async, py::none());
  }, py::arg("array"), py::arg("out"), py::arg("src"), py::arg("async_op"));
  d.def("_all_to_all", [](py::object array, py::object out, std::vector<int64_t> inCounts, std::vector<int64_t> outCounts,
                          bool async) {
    Tensor in = inputTensor(array, "all_to_all"), o = inplaceTensor(out, "all_to_all");
    return finish(released([&] { return backend("all_to_all")->allToAll(in, o, inCounts, outCounts, async); }), async,
                  py::none());
  }, py::arg("array"), py::arg("out"), py::arg("in_counts"), py::arg("out_counts"), py::arg("async_op"));

  d.def("send", [](py::object array, int dst, int64_t tag, bool async) {
    Tensor t = inputTensor(array, "send");
    return finish(released([&] { return backend("send")->send(t, dst, tag); }), async, py::none());
  }, py::arg("array"), py::arg("dst"), py::arg("tag") = 0, py::arg("async_op") = false,
     "Send `array` to rank `dst`; it matches that rank's recv with the same tag. Returns once the bytes "
     "are on their way (the array may then change), or a Work with async_op=True.");

  d.def("recv", [](py::object array, std::optional<int> src, int64_t tag, bool async) {
    Tensor t = inplaceTensor(array, "recv");
    return finishRecv(released([&] { return backend("recv")->recv(t, src.value_or(-1), tag); }), async);
  }, py::arg("array"), py::arg("src") = py::none(), py::arg("tag") = 0, py::arg("async_op") = false,
     "Receive into `array` (in place) the message rank `src` sent with this tag (src=None: whichever rank's "
     "comes first). Returns the sender's rank, or a Work (its source_rank) with async_op=True.");

  init_ddp(d);
  init_trainer(d);
  init_train_step(d);
  init_group(d);
}
