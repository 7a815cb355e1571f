// Mixed precision: cx.autocast (a context manager over nn::AutocastGuard) and cx.GradScaler. Argument
// conversion and the GIL only; the logic lives in cyxwiz/nn/autocast.* and cyxwiz/nn/grad_scaler.*.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/ddp/scaled_gradients.h"
#include "cyxwiz/nn/autocast.h"
#include "cyxwiz/nn/grad_scaler.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz;
using namespace cyxwiz::nn;
using cyxwiz::bindings::BlockingCall;

namespace {

// One `with` block per guard; the same object may be entered again (nested) on its thread.
struct AutocastContext {
  AutocastState state;
  std::vector<std::unique_ptr<AutocastGuard>> guards;
};

std::string dtypeArgument(py::handle dtype) {
  // "bfloat16"/"float16" (and the trainer's "bf16"/"fp16"); torch.bfloat16 and numpy's float16 by name.
  if (py::isinstance<py::str>(dtype)) return dtype.cast<std::string>();
  std::string name = py::str(dtype);
  if (name.rfind("torch.", 0) == 0) return name.substr(6);
  if (py::hasattr(dtype, "__name__")) return py::str(dtype.attr("__name__"));
  return name;
}

py::dict scalerStateDict(const GradScaler& s) {
  py::dict d;
  if (!s.enabled()) return d;  // as torch's: a disabled scaler has no state
  const GradScalerState st = s.state();
  d["scale"] = st.scale;
  d["growth_factor"] = st.growthFactor;
  d["backoff_factor"] = st.backoffFactor;
  d["growth_interval"] = st.growthInterval;
  d["_growth_tracker"] = st.growthTracker;
  return d;
}

}  // namespace

void init_amp(py::module_& m) {
  py::class_<AutocastContext>(m, "autocast", R"doc(
Mixed precision for the forward passes run inside it, as torch.autocast on the CPU:

    with cx.autocast("bfloat16"):
        out = model.forward(x)
    model.backward(loss.backward(out, y))   # backward follows what forward did; inside or outside

LinearModule multiplies 16-bit copies of its input and weight with float32 accumulation and keeps the
16-bit input for backward (half the activation memory); parameters, gradients, optimizer state,
losses and softmax stay float32. dtype: "bfloat16" (or "bf16") or "float16" ("fp16": pair it with
cx.GradScaler). enabled=False switches autocast off inside an autocast region. The state is per thread.
CPU and GPU models (on a GPU: cuBLASLt matmuls of the 16-bit copies, float32 accumulation).)doc")
      .def(py::init([](py::handle dtype, bool enabled) {
             return AutocastContext{{enabled, parseAutocastDtype(dtypeArgument(dtype), "cx.autocast")}, {}};
           }),
           py::arg("dtype") = "bfloat16", py::arg("enabled") = true)
      .def("__enter__", [](py::object self) {
        auto& context = self.cast<AutocastContext&>();
        context.guards.push_back(std::make_unique<AutocastGuard>(context.state));
        return self;
      })
      .def("__exit__", [](AutocastContext& self, py::args) {
        if (!self.guards.empty()) self.guards.pop_back();
        return false;
      })
      .def_property_readonly("dtype", [](const AutocastContext& self) { return dtypeName(self.state.dtype); })
      .def_property_readonly("enabled", [](const AutocastContext& self) { return self.state.enabled; })
      .def("__repr__", [](const AutocastContext& self) {
        return makeString("autocast(dtype='", dtypeName(self.state.dtype), "', enabled=",
                          self.state.enabled ? "True" : "False", ")");
      });
  m.def("is_autocast_enabled", [] { return autocastDtype().has_value(); },
        "Whether forward passes on this thread run under cx.autocast now.");
  m.def("get_autocast_dtype", [] { return dtypeName(autocastState().dtype); },
        "The 16-bit type of the innermost cx.autocast on this thread ('bfloat16' when none).");

  py::class_<GradScaler, std::shared_ptr<GradScaler>>(m, "GradScaler", R"doc(
Dynamic loss scaling for float16 mixed precision, as torch.amp.GradScaler:

    with cx.autocast("float16"):
        out = model.forward(x)
    model.backward(scaler.scale(loss.backward(out, y)))
    scaler.step(optimizer, model)   # unscales; skips the step when a gradient holds inf/NaN
    scaler.update()                 # backs off after a skipped step, grows after growth_interval good ones
    optimizer.zero_grad(model)

With a DistributedDataParallel, step(optimizer, ddp) is update_parameters (it steps and zeroes the
gradients; a skipped step zeroes them too) and every rank takes the same decision.)doc")
      .def(py::init([](double initScale, double growthFactor, double backoffFactor, int64_t growthInterval,
                       bool enabled) {
             return std::make_shared<GradScaler>(
                 GradScalerOptions{initScale, growthFactor, backoffFactor, growthInterval, enabled});
           }),
           py::arg("init_scale") = 65536.0, py::arg("growth_factor") = 2.0, py::arg("backoff_factor") = 0.5,
           py::arg("growth_interval") = 2000, py::arg("enabled") = true)
      .def("scale", [](const GradScaler& self, py::handle value) -> py::object {
        if (py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)) {
          return py::float_(value.cast<double>() * self.scale());  // a loss value, as torch's scale(loss)
        }
        return bindings::toPython(self.scale(bindings::floatTensor(value, "GradScaler.scale")));
      }, py::arg("loss_grad"), "The loss gradient (an array, or a GPU cx.Tensor that stays on the GPU: pass the "
         "result to backward), or a loss value, times the current scale.")
      .def("unscale_", [](GradScaler& self, SequentialModel& model) {
        ModelGradients grads(model);
        BlockingCall unlocked;
        return self.unscale(grads);
      }, py::arg("model"))
      .def("unscale_", [](GradScaler& self, ddp::DistributedDataParallel& d) {
        ddp::DDPGradients grads(d);
        BlockingCall unlocked;
        return self.unscale(grads);
      }, py::arg("model"), "Divide the gradients by the scale now (before clipping them); returns whether all are "
         "finite. step() then does not unscale again. Collective with a DistributedDataParallel.")
      .def("step", [](GradScaler& self, Optimizer& optimizer, SequentialModel& model) {
        ModelGradients grads(model);
        BlockingCall unlocked;
        return self.step(optimizer, grads);
      }, py::arg("optimizer"), py::arg("model"))
      .def("step", [](GradScaler& self, Optimizer& optimizer, ddp::DistributedDataParallel& d) {
        ddp::DDPGradients grads(d);
        BlockingCall unlocked;
        return self.step(optimizer, grads);
      }, py::arg("optimizer"), py::arg("model"), "Unscale (unless unscale_ ran), then optimizer.step, or skip it "
         "when a gradient holds inf/NaN. Returns True when the step was taken.")
      .def("update", [](GradScaler& self, std::optional<double> newScale) {
        if (newScale) {
          self.update(*newScale);
        } else {
          self.update();
        }
      }, py::arg("new_scale") = py::none())
      .def("get_scale", [](const GradScaler& self) { return self.scale(); }, "The current scale (1.0 when disabled).")
      .def("is_enabled", &GradScaler::enabled)
      .def("get_growth_factor", [](const GradScaler& self) { return self.state().growthFactor; })
      .def("get_backoff_factor", [](const GradScaler& self) { return self.state().backoffFactor; })
      .def("get_growth_interval", [](const GradScaler& self) { return self.state().growthInterval; })
      .def_property_readonly("last_step_skipped", &GradScaler::lastStepSkipped,
                             "Whether the last step() found inf/NaN and skipped the step.")
      .def("state_dict", &scalerStateDict)
      .def("load_state_dict", [](GradScaler& self, const py::dict& d) {
        CYX_CHECK(d.size() > 0, "GradScaler.load_state_dict: the state dict is empty, as a disabled GradScaler's is");
        GradScalerState st = self.state();
        st.scale = d["scale"].cast<double>();
        if (d.contains("growth_factor")) st.growthFactor = d["growth_factor"].cast<double>();
        if (d.contains("backoff_factor")) st.backoffFactor = d["backoff_factor"].cast<double>();
        if (d.contains("growth_interval")) st.growthInterval = d["growth_interval"].cast<int64_t>();
        if (d.contains("_growth_tracker")) st.growthTracker = d["_growth_tracker"].cast<int64_t>();
        self.loadState(st);
      }, py::arg("state_dict"))
      .def("__repr__", &GradScaler::repr);
}
