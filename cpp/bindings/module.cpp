// The _core extension: registers each area's bindings and maps engine errors to Python exceptions.
#include <pybind11/pybind11.h>

#include <cerrno>

#include "cyxwiz/common/error.h"

namespace py = pybind11;

void init_tensor(py::module_& m);
void init_nn(py::module_& m);
void init_losses(py::module_& m);
void init_optim(py::module_& m);
void init_amp(py::module_& m);
void init_info(py::module_& m);
void init_memory(py::module_& m);
void init_distributed(py::module_& m);
void init_cuda(py::module_& m);

PYBIND11_MODULE(_core, m) {
  m.doc() = "pycyxwiz C++ core (private; use `import pycyxwiz as cx`)";

  // Registered before the translator below so that `except cx.ModelFormatError` works.
  static py::exception<cyxwiz::FileFormatError> modelFormatError(m, "ModelFormatError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cyxwiz::FileFormatError& e) {
      py::set_error(modelFormatError, e.what());
    } catch (const cyxwiz::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const cyxwiz::TypeMismatch& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const cyxwiz::IoError& e) {
      // OSError(errno, msg) becomes FileNotFoundError, PermissionError, ... by itself.
      py::object err = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(PyExc_OSError, "is", e.errnoValue(), e.what()));
      PyErr_SetObject(PyExc_OSError, err.ptr());
    } catch (const cyxwiz::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  init_tensor(m);
  init_nn(m);
  init_losses(m);
  init_optim(m);
  init_amp(m);
  init_info(m);
  init_memory(m);
  init_distributed(m);
  init_cuda(m);
}
