// DistributedDataParallel, DDPConfig, DistributedSampler, DistributedBatchIterator. Conversions and
// GIL handling only; the logic lives in cyxwiz/ddp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/ddp/sampler.h"
#include "cyxwiz/ddp/wire.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz;
using namespace cyxwiz::ddp;
using cyxwiz::bindings::BlockingCall;
using cyxwiz::bindings::floatTensor;
using cyxwiz::bindings::toNumpy;

namespace {

py::list gradientViews(const DistributedDataParallel& ddp) {
  py::list out;
  for (nn::Parameter* p : ddp.parameters()) out.append(toNumpy(p->grad));
  return out;
}

// The `with ddp.no_sync():` block: restores the previous setting on exit, also after an exception.
struct NoSync {
  DistributedDataParallel& ddp;
  bool previous = true;
};

// Sampler defaults: the job's world size and rank, or a world of one before init(). Without the GIL:
// the process group's lock may be held by init() on another thread.
int defaultReplicas() {
  BlockingCall unlocked;
  return comm::isInitialized() ? comm::currentConfig("DistributedSampler").worldSize : 1;
}
int defaultRank() {
  BlockingCall unlocked;
  return comm::isInitialized() ? comm::currentConfig("DistributedSampler").rank : 0;
}

// Python's iterator protocol wants StopIteration at the end of a pass.
std::vector<int64_t> nextBatch(DistributedBatchIterator& it) {
  if (!it.hasNext()) {
    throw py::stop_iteration("DistributedBatchIterator: this epoch's batches are all taken; call reset(epoch) or "
                             "sampler.set_epoch(epoch) to start the next epoch");
  }
  return it.next();
}

}  // namespace

void init_ddp(py::module_& d) {
  py::class_<DDPConfig>(d, "DDPConfig", "Settings of DistributedDataParallel.")
      .def(py::init<>())
      .def_readwrite("broadcast_parameters", &DDPConfig::broadcastParameters,
                     "Copy rank 0's parameters to every rank on construction (default True).")
      .def_readwrite("broadcast_buffers", &DDPConfig::broadcastBuffers,
                     "Send rank 0's buffers (BatchNorm's running statistics) to every rank before each training "
                     "forward, as torch's DDP (default True).")
      .def_readwrite("bucket_size_mb", &DDPConfig::bucketSizeMb,
                     "Gradient bucket size in MiB (default 25); the first bucket is capped at 1 MiB.")
      .def_readwrite("find_unused_parameters", &DDPConfig::findUnusedParameters,
                     "Accepted for PyTorch parity; no effect (every layer of a SequentialModel gets a gradient).")
      .def_readwrite("check_gradients", &DDPConfig::checkGradients,
                     "Compare gradient and parameter checksums across ranks at every update and warn when they differ "
                     "(also CYXWIZ_DDP_CHECK_GRADIENTS=1). Costs one small all-gather per step.")
      .def_readwrite("shard_optimizer", &DDPConfig::shardOptimizer,
                     "Shard the optimizer step across ranks, as ZeRO stage 1 (also CYXWIZ_DDP_SHARD_OPTIMIZER=1; CPU "
                     "backend): gradients are reduce-scattered, each rank updates and keeps optimizer state for 1/N of "
                     "every bucket, the parameters are all-gathered. Save the optimizer with "
                     "ddp.optimizer_state_dict(optimizer).")
      .def_property(
          "gradient_dtype", [](const DDPConfig& c) { return dtypeName(c.gradientDtype); },
          [](DDPConfig& c, const std::string& name) { c.gradientDtype = parseGradientDtype(name); },
          "The dtype gradients travel in between ranks: 'float32' (default), 'bfloat16' or 'float16' (CPU and "
          "NCCL backends; on a GPU model the rounding is a kernel and NCCL reduces the 16-bit copy). 16 bits halve "
          "the bytes every step moves; gradients, optimizer and parameters stay float32 (each bucket is rounded for "
          "the all-reduce and widened back). float16 is pre-divided by the world size.")
      .def("__repr__", [](const DDPConfig& c) {
        return makeString("DDPConfig(broadcast_parameters=", c.broadcastParameters ? "True" : "False",
                          ", broadcast_buffers=", c.broadcastBuffers ? "True" : "False",
                          ", bucket_size_mb=", c.bucketSizeMb, ", find_unused_parameters=",
                          c.findUnusedParameters ? "True" : "False", ", check_gradients=",
                          c.checkGradients ? "True" : "False", ", shard_optimizer=",
                          c.shardOptimizer ? "True" : "False", ", gradient_dtype='", dtypeName(c.gradientDtype), "')");
      });

  py::class_<NoSync>(d, "_NoSync")
      .def("__enter__", [](NoSync& s) {
        s.previous = s.ddp.requireSync();
        s.ddp.setRequireSync(false);
      })
      .def("__exit__", [](NoSync& s, py::args) {
        s.ddp.setRequireSync(s.previous);
        return false;
      });

  // WaitingHolder: `del ddp` waits for the bucket all-reduces in flight, without the GIL.
  py::class_<DistributedDataParallel, bindings::WaitingHolder<DistributedDataParallel>>(d, "DistributedDataParallel", R"doc(
A model replica whose gradients are averaged across ranks. Construction is collective: every rank
must wrap the same architecture; rank 0's parameters are broadcast (DDPConfig.broadcast_parameters).
After backward, call sync_gradients() or update_parameters(optimizer) before reading gradients: their
all-reduce runs in the background.)doc")
      .def(py::init([](std::shared_ptr<nn::SequentialModel> model, std::optional<DDPConfig> config) {
             BlockingCall unlocked;
             return bindings::WaitingHolder<DistributedDataParallel>(
                 new DistributedDataParallel(std::move(model), config.value_or(DDPConfig{})));
           }),
           py::arg("model"), py::arg("ddp_config") = py::none())
      .def("forward", [](DistributedDataParallel& self, py::handle x) {
        Tensor in = cyxwiz::bindings::modelInput(x, self.model()->takesIndices(), "DistributedDataParallel.forward");
        Tensor out;
        { BlockingCall unlocked; out = self.forward(in); }
        return cyxwiz::bindings::toPython(out);
      }, py::arg("input"))
      .def("__call__", [](py::object self, py::handle x) { return self.attr("forward")(x); }, py::arg("input"))
      .def("backward", [](DistributedDataParallel& self, py::handle g, bool inputGrad) {
        Tensor grad = floatTensor(g, "DistributedDataParallel.backward");
        Tensor out;
        { BlockingCall unlocked; out = self.backward(grad, inputGrad); }
        return cyxwiz::bindings::toPython(out);
      }, py::arg("grad_output"), py::arg("input_grad") = false,
         "Accumulate this batch's gradients; each bucket's all-reduce starts as soon as it is complete. Returns the "
         "gradient w.r.t. the model input when input_grad=True, else None.")
      .def("sync_gradients", [](DistributedDataParallel& self) {
        { BlockingCall unlocked; self.syncGradients(); }
        return gradientViews(self);
      }, "Wait for the gradient all-reduces; returns the averaged gradients (views, parameters() order).")
      .def("update_parameters", &DistributedDataParallel::updateParameters, py::arg("optimizer"),
           py::call_guard<BlockingCall>(),
           "sync_gradients() if needed, optimizer.step(model), then zero the gradients.")
      .def("no_sync", [](DistributedDataParallel& self) { return NoSync{self}; }, py::keep_alive<0, 1>(),
           "Context manager: backward only accumulates locally inside it; the first backward after it averages the sum.")
      .def("zero_grad", &DistributedDataParallel::zeroGrad, py::call_guard<BlockingCall>())
      .def("optimizer_state_dict", [](DistributedDataParallel& self, const nn::Optimizer& optimizer) {
        nn::OptimizerState state;
        { BlockingCall unlocked; state = self.optimizerState(optimizer); }
        return bindings::stateDict(state);
      }, py::arg("optimizer"),
         "optimizer.state_dict() with the shards of a sharded step (shard_optimizer=True) put together from every "
         "rank: a collective, every rank calls it. Without sharding, the same as optimizer.state_dict().")
      .def_property_readonly("shard_optimizer", &DistributedDataParallel::shardsOptimizer,
                             "True when the optimizer step is sharded across ranks (DDPConfig.shard_optimizer, world "
                             "size > 1).")
      .def("parameters", [](const DistributedDataParallel& self) {
        py::list out;
        for (nn::Parameter* p : self.parameters()) out.append(toNumpy(p->value));
        return out;
      })
      .def("gradients", &gradientViews, "Gradient views into the buckets, parameters() order.")
      .def("bucket_sizes", &DistributedDataParallel::bucketSizes,
           "[(parameter count, bytes)] per bucket, in reduction order (last layers first).")
      .def_property_readonly("overlap", &DistributedDataParallel::overlap,
                             "True when bucket all-reduces overlap backward (a spare core per local rank, or "
                             "CYXWIZ_DDP_OVERLAP=1); else they run at sync time.")
      .def("is_master", &DistributedDataParallel::isMaster)
      .def("get_rank", &DistributedDataParallel::rank)
      .def("get_world_size", &DistributedDataParallel::worldSize)
      .def("get_model", &DistributedDataParallel::model)
      .def("__repr__", [](const DistributedDataParallel& self) {
        return makeString("DistributedDataParallel(rank ", self.rank(), "/", self.worldSize(), ", ",
                          self.bucketSizes().size(), " buckets)");
      });

  py::class_<DistributedSampler, std::shared_ptr<DistributedSampler>>(d, "DistributedSampler", R"doc(
This rank's share of the dataset's indices, epoch by epoch. Unshuffled, exactly those of
torch.utils.data.DistributedSampler; shuffled, a permutation seeded by seed + epoch (the same on every
rank). Call set_epoch(epoch) at the start of every epoch.)doc")
      .def(py::init([](int64_t size, bool shuffle, uint64_t seed, bool dropLast, std::optional<int> replicas,
                       std::optional<int> rank) {
             return std::make_shared<DistributedSampler>(size, replicas.value_or(defaultReplicas()),
                                                         rank.value_or(defaultRank()), shuffle, seed, dropLast);
           }),
           py::arg("dataset_size"), py::arg("shuffle") = true, py::arg("seed") = 0, py::arg("drop_last") = false,
           py::arg("num_replicas") = py::none(), py::arg("rank") = py::none())
      .def("set_epoch", &DistributedSampler::setEpoch, py::arg("epoch"))
      .def_property_readonly("epoch", &DistributedSampler::epoch)
      .def("get_indices", &DistributedSampler::indices, "This rank's indices for the current epoch.")
      .def("local_size", &DistributedSampler::localSize, "Samples for this rank.")
      .def("total_size", &DistributedSampler::totalSize, "The dataset size.")
      .def("padded_size", &DistributedSampler::paddedSize, "local_size() x num_replicas (divisible by the world size).")
      .def_property_readonly("num_replicas", &DistributedSampler::numReplicas)
      .def_property_readonly("rank", &DistributedSampler::rank)
      .def("__len__", &DistributedSampler::localSize)
      .def("__iter__", [](const DistributedSampler& s) { return py::iter(py::cast(s.indices())); });

  py::class_<DistributedBatchIterator>(d, "DistributedBatchIterator", R"doc(
The sampler's indices in batches of batch_size (the last one shorter unless drop_last). A new epoch
starts with reset(epoch), or by itself after sampler.set_epoch(epoch).)doc")
      .def(py::init<std::shared_ptr<DistributedSampler>, int64_t, bool>(), py::arg("sampler"), py::arg("batch_size"),
           py::arg("drop_last") = false)
      .def("has_next", &DistributedBatchIterator::hasNext)
      .def("next", &nextBatch, "The next batch of indices (a list); StopIteration when the pass is over.")
      .def("reset", &DistributedBatchIterator::reset, py::arg("epoch") = py::none())
      .def("num_batches", &DistributedBatchIterator::numBatches)
      .def("__len__", &DistributedBatchIterator::numBatches)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &nextBatch);
}
