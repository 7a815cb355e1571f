#include "work.h"

#include <chrono>

#include "cyxwiz/common/error.h"

namespace cyxwiz::bindings {

bool PyWork::wait(std::optional<double> timeoutSeconds) {
  if (work->isCompleted()) {  // blocking calls usually ran on this thread already
    drainPythonReleases();
    work->wait();
    return true;
  }
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto slice = std::chrono::milliseconds(100);
    if (timeoutSeconds) {
      auto left = std::chrono::duration<double>(*timeoutSeconds) - (std::chrono::steady_clock::now() - start);
      if (left <= std::chrono::duration<double>(0)) {
        throw TimeoutError(makeString(work->description(), ": Work.wait: not completed within ", *timeoutSeconds,
                                      " s (it is still running; wait again, or raise the timeout)"));
      }
      slice = std::min(slice, std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(1));
    }
    bool done;
    {
      BlockingCall unlocked;
      done = work->waitFor(slice);
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

py::object finish(std::shared_ptr<comm::Work> work, bool async, py::object result) {
  PyWork w{std::move(work), std::move(result)};
  if (async) return py::cast(std::move(w));
  w.wait(std::nullopt);
  return w.result;
}

py::object finishRecv(std::shared_ptr<comm::Work> work, bool async) {
  if (async) return finish(std::move(work), true, py::none());
  PyWork w{work, py::none()};
  w.wait(std::nullopt);
  return py::int_(work->sourceRank());
}

}  // namespace cyxwiz::bindings
