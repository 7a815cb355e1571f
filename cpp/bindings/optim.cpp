// Optimizers. state_dict() flattens OptimizerState into one dict: floats for scalars, arrays for buffers.
#include <pybind11/pybind11.h>

#include "cyxwiz/nn/adam.h"
#include "cyxwiz/nn/sequential.h"
#include "cyxwiz/nn/sgd.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz::nn;

namespace cyxwiz::bindings {
py::dict stateDict(const OptimizerState& state) {
  py::dict out;
  for (const auto& [key, value] : state.scalars) out[py::str(key)] = value;
  for (const auto& [key, tensor] : state.tensors) out[py::str(key)] = toNumpy(tensor);
  return out;
}
}  // namespace cyxwiz::bindings

void init_optim(py::module_& m) {
  py::class_<Optimizer, std::shared_ptr<Optimizer>>(m, "Optimizer", "Base class of the optimizers.")
      .def("step", &Optimizer::step, py::arg("model"), py::call_guard<cyxwiz::bindings::BlockingCall>(),
           "Update every parameter of `model` from its accumulated gradient.")
      .def("zero_grad", &Optimizer::zeroGrad, py::arg("model"), py::call_guard<cyxwiz::bindings::BlockingCall>(),
           "Zero the model's gradients (after the all-reduces DDP has in flight).")
      .def_property("learning_rate", &Optimizer::learningRate, &Optimizer::setLearningRate)
      .def_property_readonly("step_count", &Optimizer::stepCount)
      .def("state_dict", [](const Optimizer& self) {
        OptimizerState state;
        {
          cyxwiz::bindings::BlockingCall unlocked;  // GPU buffers: waits for the step that writes them
          state = self.state();
        }
        return cyxwiz::bindings::stateDict(state);
      }, "Step count, hyper-parameters and per-parameter buffers (copies).")
      .def("load_state_dict", [](Optimizer& self, const py::dict& d) {
        OptimizerState state;
        for (auto item : d) {
          std::string key = py::str(item.first);
          if (py::isinstance<py::array>(item.second)) {
            state.tensors[key] = cyxwiz::bindings::floatTensor(item.second, "load_state_dict").clone();
          } else {
            state.scalars[key] = item.second.cast<double>();
          }
        }
        self.loadState(state);
      }, py::arg("state"))
      .def("__repr__", &Optimizer::repr);

  py::class_<SGDOptimizer, Optimizer, std::shared_ptr<SGDOptimizer>>(m, "SGDOptimizer", "SGD as torch.optim.SGD.")
      .def(py::init<double, double, double, bool>(), py::arg("lr"), py::arg("momentum") = 0.0,
           py::arg("weight_decay") = 0.0, py::arg("nesterov") = false);
  py::class_<AdamOptimizer, Optimizer, std::shared_ptr<AdamOptimizer>>(m, "AdamOptimizer", "Adam as torch.optim.Adam.")
      .def(py::init<double, double, double, double, double>(), py::arg("lr") = 0.001, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.0);
  py::class_<AdamWOptimizer, AdamOptimizer, std::shared_ptr<AdamWOptimizer>>(m, "AdamWOptimizer",
      "Adam with decoupled weight decay, as torch.optim.AdamW.")
      .def(py::init<double, double, double, double, double>(), py::arg("lr") = 0.001, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.01);
}
