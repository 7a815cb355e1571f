// cx.distributed.TrainStep: conversions and GIL handling only; the logic lives in cyxwiz/ddp/train_step.*.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "cyxwiz/ddp/train_step.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz;
using namespace cyxwiz::ddp;

void init_train_step(py::module_& d) {
  // WaitingHolder: the destructor waits for a replayed step still in flight, without the GIL.
  py::class_<TrainStep, bindings::WaitingHolder<TrainStep>>(d, "TrainStep", R"doc(
One training step of a DistributedDataParallel model on a batch: forward, loss, backward, gradient
averaging, optimizer, as ddp.forward / loss_fn.backward / ddp.backward / ddp.update_parameters do. The
batch's loss and correct predictions are added to running sums kept on the model's device, so a GPU
step waits for nothing; loss() and accuracy() read them.

cuda_graphs=True (GPU models): the first batch runs eagerly, the second is captured into a CUDA graph,
and every later batch of that size replays it as one launch. Ignored, with a notice, where the step
cannot be captured (CPU model, CPU backend with several ranks, check_gradients, a GradScaler:
mixed_precision='fp16'); mixed_precision='bf16' is captured.)doc")
      .def(py::init([](DistributedDataParallel& ddp, std::shared_ptr<nn::Loss> loss,
                       std::shared_ptr<nn::Optimizer> optimizer, bool cudaGraphs,
                       std::optional<std::string> mixedPrecision, std::shared_ptr<nn::GradScaler> scaler) {
             const std::optional<DType> mixed = parseMixedPrecision(mixedPrecision.value_or(""));
             if (mixed == DType::Float16 && !scaler) scaler = std::make_shared<nn::GradScaler>();
             std::unique_ptr<TrainStep> step;
             {
               bindings::BlockingCall unlocked;
               step.reset(new TrainStep(ddp, std::move(loss), std::move(optimizer), cudaGraphs, "TrainStep"));
               step->setMixedPrecision(mixed, mixed == DType::Float16 ? scaler : nullptr);
             }
             return bindings::WaitingHolder<TrainStep>(step.release());
           }),
           py::arg("ddp"), py::arg("loss_fn"), py::arg("optimizer"), py::arg("cuda_graphs") = false,
           py::arg("mixed_precision") = py::none(), py::arg("grad_scaler") = py::none(), py::keep_alive<1, 2>())
      .def("__call__", [](TrainStep& self, py::handle X, py::handle y) {
        Tensor x = bindings::floatTensor(X, "TrainStep X");
        Tensor t = bindings::lossTargetTensor(self.loss().takesClassIndices(), y, "TrainStep y");
        bindings::BlockingCall unlocked;
        self.run(x, t);
      }, py::arg("X"), py::arg("y"), "Train on one batch (numpy, a cx.Tensor or a CUDA array).")
      .def("loss", &TrainStep::meanLoss, py::call_guard<bindings::BlockingCall>(),
           "Mean loss per sample since the last reset (waits for the GPU); NaN before the first batch.")
      .def("accuracy", &TrainStep::accuracy, py::call_guard<bindings::BlockingCall>(),
           "Fraction of correct predictions since the last reset; NaN for MSELoss or before the first batch.")
      .def_property_readonly("samples", [](TrainStep& self) {
        bindings::BlockingCall unlocked;  // waits for a replayed step, like loss()
        return self.totals()[2];
      },
                             "Samples trained on since the last reset (this rank).")
      .def("reset", &TrainStep::reset, py::call_guard<bindings::BlockingCall>(),
           "Clear the running loss, accuracy and sample count.")
      .def_property_readonly("graphed", &TrainStep::graphed, "True when full batches replay a CUDA graph.")
      .def_property_readonly("replays", &TrainStep::replays, "Steps replayed from the CUDA graph so far.")
      .def_property_readonly("grad_scaler", &TrainStep::gradScaler,
                             "The cx.GradScaler of mixed_precision='fp16' (None otherwise).");
}
