// DistributedTrainer, its config and history. Conversions and GIL handling only; the logic lives in
// cyxwiz/ddp/trainer.*, the progress rendering in pycyxwiz/_progress.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "cyxwiz/common/error.h"
#include "cyxwiz/ddp/train_step.h"
#include "cyxwiz/ddp/trainer.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz;
using namespace cyxwiz::ddp;
using cyxwiz::bindings::BlockingCall;
using cyxwiz::bindings::floatTensor;
using cyxwiz::bindings::lossTargetTensor;
using cyxwiz::bindings::toNumpy;

namespace {

struct Dataset {
  Tensor X, y;
};

Dataset dataset(const nn::Loss& loss, py::handle X, py::handle y, const char* who) {
  std::string xs = std::string(who) + " X", ys = std::string(who) + " y";
  return {floatTensor(X, xs.c_str()), lossTargetTensor(loss.takesClassIndices(), y, ys.c_str())};
}

}  // namespace

void init_trainer(py::module_& d) {
  py::class_<TrainingConfig>(d, "DistributedTrainingConfig", "Settings of DistributedTrainer.fit.")
      .def(py::init<>())
      .def_readwrite("epochs", &TrainingConfig::epochs, "Epochs to train (default 10).")
      .def_readwrite("batch_size", &TrainingConfig::batchSize, "Batch size per rank (default 32).")
      .def_readwrite("shuffle", &TrainingConfig::shuffle, "Reshuffle every epoch, seeded by seed + epoch (default True).")
      .def_readwrite("seed", &TrainingConfig::seed, "Seed of the sampler's shuffle (default 42).")
      .def_readwrite("drop_last", &TrainingConfig::dropLast, "Drop the tail instead of padding the shards (default False).")
      .def_readwrite("verbose", &TrainingConfig::verbose, "Progress on rank 0 (default True).")
      .def_readwrite("log_every_n_batches", &TrainingConfig::logEveryNBatches, "Progress interval (default 10).")
      .def_readwrite("checkpoint_every_n_epochs", &TrainingConfig::checkpointEveryNEpochs,
                     "Write a checkpoint every N epochs; 0 (default) never.")
      .def_readwrite("checkpoint_dir", &TrainingConfig::checkpointDir, "Default './checkpoints'.")
      .def_readwrite("save_on_master_only", &TrainingConfig::saveOnMasterOnly,
                     "Only rank 0 writes checkpoints (default True); else every rank writes its own.")
      .def_readwrite("validation_split", &TrainingConfig::validationSplit,
                     "Hold out this last fraction of the rows for validation (default 0.0).")
      .def_readwrite("resume_from_checkpoint", &TrainingConfig::resumeFromCheckpoint,
                     "'' (default), 'latest' (newest checkpoint in checkpoint_dir, if any) or a checkpoint path.")
      .def_readwrite("cuda_graphs", &TrainingConfig::cudaGraphs,
                     "Replay each full batch's step as a CUDA graph on a GPU model (default False); ignored, with a "
                     "notice, where the step cannot be captured (CPU model, CPU backend with several ranks, "
                     "check_gradients).")
      .def_property("mixed_precision",
                    [](const TrainingConfig& c) -> py::object {
                      if (c.mixedPrecision.empty()) return py::none();
                      return py::str(c.mixedPrecision);
                    },
                    [](TrainingConfig& c, std::optional<std::string> v) {
                      c.mixedPrecision = v.value_or("");
                      parseMixedPrecision(c.mixedPrecision);  // refuses anything else at once
                    },
                    "None (default: float32), 'bf16' or 'fp16': forward passes under cx.autocast (16-bit linear "
                    "operands, float32 accumulation, 16-bit activations kept); 'fp16' adds dynamic loss scaling "
                    "(trainer.grad_scaler, kept in checkpoints). Every rank must use the same. CPU models only.")
      .def("__repr__", [](const TrainingConfig& c) {
        auto flag = [](bool b) { return b ? "True" : "False"; };
        return makeString("DistributedTrainingConfig(epochs=", c.epochs, ", batch_size=", c.batchSize, ", shuffle=",
                          flag(c.shuffle), ", seed=", c.seed, ", drop_last=", flag(c.dropLast), ", verbose=",
                          flag(c.verbose), ", log_every_n_batches=", c.logEveryNBatches, ", checkpoint_every_n_epochs=",
                          c.checkpointEveryNEpochs, ", checkpoint_dir='", c.checkpointDir, "', save_on_master_only=",
                          flag(c.saveOnMasterOnly), ", validation_split=", c.validationSplit,
                          ", resume_from_checkpoint='", c.resumeFromCheckpoint, "', cuda_graphs=", flag(c.cudaGraphs),
                          ", mixed_precision=", c.mixedPrecision.empty() ? "None" : "'" + c.mixedPrecision + "'", ")");
      });

  py::class_<TrainingHistory>(d, "DistributedTrainingHistory", "What fit() reports; identical on every rank.")
      .def(py::init<>())
      .def_readwrite("train_losses", &TrainingHistory::trainLosses)
      .def_readwrite("train_accuracies", &TrainingHistory::trainAccuracies)
      .def_readwrite("val_losses", &TrainingHistory::valLosses)
      .def_readwrite("val_accuracies", &TrainingHistory::valAccuracies)
      .def_readwrite("total_time_seconds", &TrainingHistory::totalTimeSeconds)
      .def_readwrite("samples_per_second", &TrainingHistory::samplesPerSecond)
      .def_readwrite("effective_batch_size", &TrainingHistory::effectiveBatchSize)
      .def_readwrite("world_size", &TrainingHistory::worldSize)
      .def_readwrite("start_epoch", &TrainingHistory::startEpoch)
      .def("__repr__", [](const TrainingHistory& h) {
        return makeString("DistributedTrainingHistory(epochs=", h.trainLosses.size(), ", world_size=", h.worldSize,
                          ", samples_per_second=", h.samplesPerSecond, ")");
      });

  py::class_<ProgressEvent> event(d, "_ProgressEvent");
  py::enum_<ProgressEvent::Kind>(event, "Kind")
      .value("EPOCH_BEGIN", ProgressEvent::Kind::EpochBegin)
      .value("BATCH", ProgressEvent::Kind::Batch)
      .value("EPOCH_END", ProgressEvent::Kind::EpochEnd)
      .value("MESSAGE", ProgressEvent::Kind::Message);
  event.def_readonly("kind", &ProgressEvent::kind)
      .def_readonly("epoch", &ProgressEvent::epoch)
      .def_readonly("epochs", &ProgressEvent::epochs)
      .def_readonly("batch", &ProgressEvent::batch)
      .def_readonly("batches", &ProgressEvent::batches)
      .def_readonly("loss", &ProgressEvent::loss)
      .def_readonly("accuracy", &ProgressEvent::accuracy)
      .def_readonly("has_accuracy", &ProgressEvent::hasAccuracy)
      .def_readonly("has_validation", &ProgressEvent::hasValidation)
      .def_readonly("val_loss", &ProgressEvent::valLoss)
      .def_readonly("val_accuracy", &ProgressEvent::valAccuracy)
      .def_readonly("samples_per_second", &ProgressEvent::samplesPerSecond)
      .def_readonly("seconds", &ProgressEvent::seconds)
      .def_readonly("text", &ProgressEvent::text);

  // WaitingHolder: its DDP's destructor waits for the all-reduces in flight, without the GIL.
  py::class_<DistributedTrainer, bindings::WaitingHolder<DistributedTrainer>>(d, "DistributedTrainer", R"doc(
fit / evaluate / predict / checkpoints over DistributedDataParallel. Every method is collective:
every rank calls it, with the same arguments (each rank may hold the whole dataset; fit shards it).)doc")
      .def(py::init([](std::shared_ptr<nn::SequentialModel> model, std::shared_ptr<nn::Loss> loss,
                       std::shared_ptr<nn::Optimizer> optimizer, std::optional<DDPConfig> config) {
             BlockingCall unlocked;
             return bindings::WaitingHolder<DistributedTrainer>(new DistributedTrainer(
                 std::move(model), std::move(loss), std::move(optimizer), config.value_or(DDPConfig{})));
           }),
           py::arg("model"), py::arg("loss_fn"), py::arg("optimizer"), py::arg("ddp_config") = py::none())
      .def("fit", [](DistributedTrainer& self, py::handle X, py::handle y, const TrainingConfig& config) {
        Dataset train = dataset(self.lossFunction(), X, y, "fit");
        BlockingCall unlocked;
        return self.fit(train.X, train.y, config);
      }, py::arg("X"), py::arg("y"), py::arg("config"))
      .def("fit", [](DistributedTrainer& self, py::handle X, py::handle y, py::handle Xv, py::handle yv,
                     const TrainingConfig& config) {
        Dataset train = dataset(self.lossFunction(), X, y, "fit");
        Dataset val = dataset(self.lossFunction(), Xv, yv, "fit validation");
        BlockingCall unlocked;
        return self.fit(train.X, train.y, val.X, val.y, config);
      }, py::arg("X"), py::arg("y"), py::arg("X_val"), py::arg("y_val"), py::arg("config"))
      .def("evaluate", [](DistributedTrainer& self, py::handle X, py::handle y, int64_t batchSize) {
        Dataset data = dataset(self.lossFunction(), X, y, "evaluate");
        BlockingCall unlocked;
        return self.evaluate(data.X, data.y, batchSize);
      }, py::arg("X"), py::arg("y"), py::arg("batch_size") = 256,
         "(loss, accuracy) over all rows, each counted once, the same on every rank.")
      .def("predict", [](DistributedTrainer& self, py::handle X, int64_t batchSize) {
        Tensor in = floatTensor(X, "predict X");
        Tensor out;
        { BlockingCall unlocked; out = self.predict(in, batchSize); }
        return toNumpy(out);
      }, py::arg("X"), py::arg("batch_size") = 256, "The model's outputs for every row of X, in order, on every rank.")
      .def("save_checkpoint", &DistributedTrainer::saveCheckpoint, py::arg("path"),
           py::call_guard<BlockingCall>(), "Rank 0 writes model, optimizer, epoch and RNG state atomically.")
      .def("load_checkpoint", &DistributedTrainer::loadCheckpoint, py::arg("path"),
           py::call_guard<BlockingCall>(), "Rank 0 reads, every rank loads; the next fit continues from it.")
      .def("_set_progress", [](DistributedTrainer& self, py::object callback) {
        if (callback.is_none()) return self.setProgress(nullptr);
        // The trainer, and this function with it, may be destroyed without the GIL: the reference is
        // held by a pythonOwner (gil.h). Called on the thread running fit, which released the GIL.
        std::shared_ptr<void> owner = bindings::pythonOwner(callback);
        self.setProgress([owner, fn = py::handle(callback)](const ProgressEvent& e) {
          py::gil_scoped_acquire gil;
          fn(e);
        });
      })
      .def("is_master", &DistributedTrainer::isMaster)
      .def("get_rank", &DistributedTrainer::rank)
      .def("get_world_size", &DistributedTrainer::worldSize)
      .def("get_model", &DistributedTrainer::model)
      .def("get_ddp", &DistributedTrainer::ddp, py::return_value_policy::reference_internal)
      .def_property("grad_scaler", &DistributedTrainer::gradScaler, &DistributedTrainer::setGradScaler,
                    "The cx.GradScaler of mixed_precision='fp16' (None until the first such fit or a checkpoint "
                    "that holds one); set it before fit for other settings than the defaults.");
}
