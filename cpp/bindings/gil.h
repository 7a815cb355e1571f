// The GIL rule of the bindings: no C++ thread ever waits for the GIL, and no binding waits for a C++
// thread while it holds the GIL.
//
// A tensor made from a numpy array (or any Python object) keeps that object alive, and its last
// reference may go on the communication thread, which has no Python state and must never take the
// GIL: the binding thread may be holding it while it waits for that very thread (`del ddp`, a
// collective queued behind), and both would wait forever. So a Python reference dropped on a thread
// that does not hold the GIL is queued instead (releaseWithGil) and released by the next Python
// thread that leaves a blocking binding (BlockingCall) or converts an argument (pythonOwner), with
// the GIL held and no engine lock taken. Bindings that can wait release the GIL through BlockingCall;
// bound classes whose destructor waits use the WaitingHolder, which releases it around the delete.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

namespace cyxwiz::bindings {

namespace py = pybind11;

// Calls release(p) now when this thread holds the GIL, else queues it for drainPythonReleases.
// Safe from any thread, including ones Python has never seen, and cheap.
void releaseWithGil(void (*release)(void*), void* p) noexcept;
// Runs the queued releases; the caller holds the GIL and no engine lock.
void drainPythonReleases() noexcept;

// Keeps `obj` alive from C++; the last owner may be dropped on any thread.
std::shared_ptr<void> pythonOwner(py::object obj);

// For py::call_guard and scoped use: the GIL is released for the call, and when the call returns
// (GIL held again) the Python references other threads dropped meanwhile are released.
class BlockingCall {
 public:
  BlockingCall() = default;
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

 private:
  struct Drain {
    ~Drain() { drainPythonReleases(); }
  };
  Drain drain_;                     // destroyed last: after the GIL is back
  py::gil_scoped_release release_;  // destroyed first
};

// The holder of a bound class whose C++ destructor waits for collectives (DDP, the trainer): pybind11
// runs destructors with the GIL held, so the delete releases it. PyEval_SaveThread rather than
// gil_scoped_release, which looks up pybind11's internals: this may run late in interpreter exit.
template <typename T>
struct ReleaseGilDelete {
  void operator()(T* p) const noexcept {
    if (!PyGILState_Check()) {
      delete p;
      return;
    }
    PyThreadState* state = PyEval_SaveThread();
    delete p;
    PyEval_RestoreThread(state);
    drainPythonReleases();
  }
};
template <typename T>
using WaitingHolder = std::unique_ptr<T, ReleaseGilDelete<T>>;

}  // namespace cyxwiz::bindings
