// Layers and SequentialModel. Arrays convert at the boundary; the GIL is released while the engine computes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cyxwiz/nn/dropout.h"
#include "cyxwiz/nn/gelu.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/sequential.h"
#include "cyxwiz/nn/sigmoid.h"
#include "cyxwiz/nn/softmax.h"
#include "cyxwiz/nn/tanh.h"
#include "cyxwiz/device/cuda.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz::nn;
using cyxwiz::Tensor;
using cyxwiz::bindings::floatTensor;
using cyxwiz::bindings::toNumpy;
using cyxwiz::bindings::toPython;

namespace {

template <typename Params>
py::list valueViews(const Params& params) {
  py::list out;
  for (Parameter* p : params) out.append(toNumpy(p->value));
  return out;
}

template <typename Params>
py::list gradViews(const Params& params) {
  py::list out;
  for (Parameter* p : params) out.append(toNumpy(p->grad));
  return out;
}

constexpr const char* kViewsNote =
    " Numpy views of the live buffers: writing to them changes the model (host copies for a model on a GPU).";

}  // namespace

void init_nn(py::module_& m) {
  py::class_<Module, std::shared_ptr<Module>>(m, "Module", "Base class of every layer.")
      .def("forward", [](Module& self, py::handle x) {
        Tensor in = floatTensor(x, (self.typeName() + ".forward").c_str());
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = self.forward(in); }
        return toPython(out);
      }, py::arg("input"))
      .def("__call__", [](py::object self, py::handle x) { return self.attr("forward")(x); }, py::arg("input"))
      .def("backward", [](Module& self, py::handle g) {
        Tensor grad = floatTensor(g, (self.typeName() + ".backward").c_str());
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; self.setNeedInputGrad(true); out = self.backward(grad); }
        return toPython(out);
      }, py::arg("grad_output"), "Accumulates parameter gradients; returns the gradient w.r.t. the input.")
      .def("parameters", [](Module& self) { return valueViews(self.parameters()); },
           (std::string("Weights then bias.") + kViewsNote).c_str())
      .def("gradients", [](Module& self) { return gradViews(self.parameters()); },
           (std::string("Gradients, in parameters() order.") + kViewsNote).c_str())
      .def("zero_grad", &Module::zeroGrad)
      .def("num_parameters", &Module::numParameters)
      .def("_saved_tensors", [](const Module& self) {
        py::list out;
        for (const Tensor& t : self.savedTensors()) {
          py::dict d;
          d["dtype"] = cyxwiz::dtypeName(t.dtype());
          d["shape"] = py::tuple(py::cast(t.shape()));
          d["nbytes"] = t.nbytes();
          d["data_ptr"] = reinterpret_cast<uintptr_t>(t.rawData());
          out.append(d);
        }
        return out;
      }, "What forward kept for backward: dtype, shape, nbytes, data_ptr of each (LinearModule, ReLUModule).")
      .def("train", [](Module& self) { self.setTraining(true); })
      .def("eval", [](Module& self) { self.setTraining(false); })
      .def_property_readonly("training", &Module::training)
      .def("__repr__", &Module::repr);

  py::class_<LinearModule, Module, std::shared_ptr<LinearModule>>(m, "LinearModule",
      "y = x W^T + b with W of shape (out_features, in_features); Kaiming-uniform init as torch.nn.Linear.")
      .def(py::init<int64_t, int64_t, bool>(), py::arg("in_features"), py::arg("out_features"), py::arg("bias") = true)
      .def_property_readonly("in_features", [](const LinearModule& l) { return l.inFeatures(); })
      .def_property_readonly("out_features", [](const LinearModule& l) { return l.outFeatures(); })
      .def_property_readonly("bias", &LinearModule::hasBias);
  py::class_<ReLUModule, Module, std::shared_ptr<ReLUModule>>(m, "ReLUModule").def(py::init<>());
  py::class_<SigmoidModule, Module, std::shared_ptr<SigmoidModule>>(m, "SigmoidModule").def(py::init<>());
  py::class_<TanhModule, Module, std::shared_ptr<TanhModule>>(m, "TanhModule").def(py::init<>());
  py::class_<GELUModule, Module, std::shared_ptr<GELUModule>>(m, "GELUModule", "Exact (erf) GELU.").def(py::init<>());
  py::class_<SoftmaxModule, Module, std::shared_ptr<SoftmaxModule>>(m, "SoftmaxModule", "Softmax over the last axis.")
      .def(py::init<>());
  py::class_<DropoutModule, Module, std::shared_ptr<DropoutModule>>(m, "DropoutModule",
      "Inverted dropout in train mode, identity in eval mode.")
      .def(py::init<double>(), py::arg("p") = 0.5)
      .def_property_readonly("p", &DropoutModule::p);

  py::class_<SequentialModel, std::shared_ptr<SequentialModel>>(m, "SequentialModel", R"pbdoc(
Layers applied in order. ``forward`` caches what ``backward`` needs; ``backward`` adds into the
gradients (call ``zero_grad`` between steps, or don't, to accumulate).
)pbdoc")
      .def(py::init<>())
      .def("add", &SequentialModel::add, py::arg("module"))
      .def("forward", [](SequentialModel& self, py::handle x) {
        Tensor in = floatTensor(x, "SequentialModel.forward");
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = self.forward(in); }
        return toPython(out);
      }, py::arg("input"))
      .def("__call__", [](py::object self, py::handle x) { return self.attr("forward")(x); }, py::arg("input"))
      .def("backward", [](SequentialModel& self, py::handle g, bool inputGrad) {
        Tensor grad = floatTensor(g, "SequentialModel.backward");
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = self.backward(grad, inputGrad); }
        return toPython(out);
      }, py::arg("grad_output"), py::arg("input_grad") = false,
         "Accumulates parameter gradients. Returns the gradient w.r.t. the model input when input_grad=True, else None.")
      .def("to", [](std::shared_ptr<SequentialModel> self, const std::string& device) {
        cyxwiz::Device d = cyxwiz::device::parseDevice(device);
        { cyxwiz::bindings::BlockingCall unlocked; self->to(d); }
        return self;
      }, py::arg("device"), R"pbdoc(
Moves the parameters to "cpu", "cuda" or "cuda:N" and returns the model. numpy inputs are then copied
to that device in forward; outputs and gradients stay there as cx.Tensor (np.asarray copies them back).
)pbdoc")
      .def_property_readonly("device", [](const SequentialModel& self) { return self.device().str(); })
      .def("zero_grad", &SequentialModel::zeroGrad, py::call_guard<cyxwiz::bindings::BlockingCall>())
      .def("parameters", [](const SequentialModel& self) { return valueViews(self.parameters()); },
           (std::string("Weights then bias, layer by layer.") + kViewsNote).c_str())
      .def("gradients", [](const SequentialModel& self) {
        { cyxwiz::bindings::BlockingCall unlocked; self.guardGradients(SequentialModel::GradientUse::Read); }
        return gradViews(self.parameters());
      },
           (std::string("Gradients, in parameters() order.") + kViewsNote).c_str())
      .def("named_parameters", [](const SequentialModel& self) {
        py::list out;
        for (size_t i = 0; i < self.size(); ++i) {
          for (Parameter* p : self.at(i)->parameters()) {
            out.append(py::make_tuple(std::to_string(i) + "." + p->name, toNumpy(p->value)));
          }
        }
        return out;
      }, "[(\"0.weight\", array), ...] in parameters() order.")
      .def("num_parameters", &SequentialModel::numParameters)
      .def("train", &SequentialModel::train)
      .def("eval", &SequentialModel::eval)
      .def_property_readonly("training", &SequentialModel::training)
      .def("set_gradient_checkpointing", [](SequentialModel& self, py::handle segments) {
        // True would mean one segment, which recomputes nothing: ask for the number instead.
        if (PyBool_Check(segments.ptr())) {
          throw py::type_error("set_gradient_checkpointing(segments): segments is a number of segments "
                               "(2 or more; 0 turns checkpointing off), not a bool");
        }
        self.setGradientCheckpointing(segments.cast<int>());
      }, py::arg("segments"), R"pbdoc(
Gradient checkpointing, as torch.utils.checkpoint.checkpoint_sequential(functions, segments, input):
with segments=k >= 2, a training forward splits the layers into k contiguous segments of near-equal
size and keeps only each segment's input; backward recomputes each segment's forward from it (the last
segment keeps its caches). Less activation memory for about one more forward; the gradients are
bit-identical (Dropout redraws the same masks). 0 turns it off (the default); 1 is one segment, nothing
recomputed. A LinearModule and the ReLUModule after it stay in one segment, so asking more segments
than that forms one per pair or layer. eval() forwards are unaffected; not saved in model files.
)pbdoc")
      .def_property_readonly("gradient_checkpointing", &SequentialModel::gradientCheckpointing,
                             "The segments set by set_gradient_checkpointing (0: off).")
      .def("summary", [](const SequentialModel& self, std::optional<int64_t> in) { return self.summary(in.value_or(-1)); },
           py::arg("in_features") = py::none())
      .def("save", &SequentialModel::save, py::arg("path"), py::call_guard<cyxwiz::bindings::BlockingCall>(),
           "Write a .cyxmodel file atomically (temp file + rename).")
      .def_static("load", &SequentialModel::load, py::arg("path"), py::call_guard<cyxwiz::bindings::BlockingCall>(),
                  "Read a .cyxmodel file; a corrupt, truncated or foreign file raises cx.ModelFormatError.")
      .def("__len__", &SequentialModel::size)
      .def("__getitem__", [](const SequentialModel& self, int64_t i) {
        int64_t n = static_cast<int64_t>(self.size());
        return self.at(static_cast<size_t>(i < 0 ? i + n : i));
      })
      .def("__repr__", &SequentialModel::repr);
}
