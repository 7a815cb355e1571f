// Losses and the accuracy helper.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cyxwiz/nn/cross_entropy.h"
#include "cyxwiz/nn/mse.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz::nn;
using cyxwiz::Tensor;
using cyxwiz::bindings::floatTensor;
using cyxwiz::bindings::targetTensor;
using cyxwiz::bindings::toNumpy;

namespace {

Tensor lossTarget(Loss& loss, py::handle target) {
  std::string what = loss.typeName() + " target";
  return cyxwiz::bindings::lossTargetTensor(loss.takesClassIndices(), target, what.c_str());
}

}  // namespace

void init_losses(py::module_& m) {
  py::class_<Loss, std::shared_ptr<Loss>>(m, "Loss", "Base class of the losses.")
      .def("forward", [](Loss& self, py::handle out, py::handle target) {
        Tensor o = floatTensor(out, (self.typeName() + ".forward").c_str());
        Tensor t = lossTarget(self, target);
        cyxwiz::bindings::BlockingCall unlocked;
        return self.forward(o, t);
      }, py::arg("output"), py::arg("target"), "Mean loss over the batch.")
      .def("__call__", [](py::object self, py::handle out, py::handle target) { return self.attr("forward")(out, target); },
           py::arg("output"), py::arg("target"))
      .def("backward", [](Loss& self, py::handle out, py::handle target) {
        Tensor o = floatTensor(out, (self.typeName() + ".backward").c_str());
        Tensor t = lossTarget(self, target);
        Tensor g;
        { cyxwiz::bindings::BlockingCall unlocked; g = self.backward(o, t); }
        return cyxwiz::bindings::toPython(g);
      }, py::arg("output"), py::arg("target"), "Gradient of the mean loss w.r.t. output.")
      .def("__repr__", [](const Loss& self) { return self.typeName() + "()"; });

  py::class_<CrossEntropyLoss, Loss, std::shared_ptr<CrossEntropyLoss>>(m, "CrossEntropyLoss",
      "Softmax cross-entropy on raw logits; targets are class indices (any int dtype) or one-hot/probability rows.\n"
      "A class index equal to ignore_index (torch's default -100; None: none) counts neither in the mean nor in\n"
      "accuracy, and its gradient is 0.")
      .def(py::init<std::optional<int64_t>>(), py::arg("ignore_index") = -100)
      .def_property_readonly("ignore_index", &CrossEntropyLoss::ignoreIndex)
      .def("__repr__", [](const CrossEntropyLoss& self) {
        const auto ignore = self.ignoreIndex();
        if (ignore == -100) return std::string("CrossEntropyLoss()");
        return "CrossEntropyLoss(ignore_index=" + (ignore ? std::to_string(*ignore) : std::string("None")) + ")";
      });
  py::class_<MSELoss, Loss, std::shared_ptr<MSELoss>>(m, "MSELoss", "Mean squared error over all elements.")
      .def(py::init<>());

  m.def("accuracy", [](py::handle out, py::handle target, std::optional<int64_t> ignore) {
    Tensor o = floatTensor(out, "accuracy");
    Tensor t = targetTensor(target, "accuracy target");
    cyxwiz::bindings::BlockingCall unlocked;  // GPU outputs: waits for the kernels that produce them
    return accuracy(o, t, ignore);
  }, py::arg("output"), py::arg("target"), py::arg("ignore_index") = py::none(),
     "Fraction of rows (positions of a sequence) whose argmax is the target class, leaving out those whose\n"
     "class index is ignore_index.");
}
