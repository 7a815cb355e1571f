// cx.distributed.Work: a collective started with async_op=True, and the helpers every collective
// binding shares (distributed.cpp, group.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>

#include "cyxwiz/comm/work.h"
#include "gil.h"

namespace cyxwiz::bindings {

namespace py = pybind11;

// A Work and what the collective hands back when it is done (gathered arrays, a part).
struct PyWork {
  std::shared_ptr<comm::Work> work;
  py::object result = py::none();

  // Waits with the GIL released, waking every 100 ms so that Ctrl-C is not held up. Each wake-up
  // (BlockingCall) releases the arrays the communication thread let go of (gil.h). TimeoutError
  // when `timeoutSeconds` pass first (the collective goes on).
  bool wait(std::optional<double> timeoutSeconds);
};

// async: the Work; else waits and returns `result`.
py::object finish(std::shared_ptr<comm::Work> work, bool async, py::object result);
// A recv: async, the Work (its source_rank says whose message it took); else waits and returns that rank.
py::object finishRecv(std::shared_ptr<comm::Work> work, bool async);

// One GIL release per call: the backend lookup (which may wait for init() on another thread) and
// the collective run in the same released section.
template <typename F>
std::shared_ptr<comm::Work> released(F&& f) {
  BlockingCall unlocked;
  return f();
}

}  // namespace cyxwiz::bindings
