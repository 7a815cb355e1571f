#include "gil.h"

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

namespace cyxwiz::bindings {

namespace {

struct Pending {
  void (*release)(void*);
  void* p;
};

struct Queue {
  std::mutex mutex;
  std::vector<Pending> items;
  std::atomic<bool> nonEmpty{false};  // lets drainPythonReleases skip the lock on every call
};

// Never destroyed: a communication thread may still drop a tensor while static destructors run at exit.
Queue& queue() {
  static Queue* q = new Queue;
  return *q;
}

void deleteObject(void* p) { delete static_cast<py::object*>(p); }

}  // namespace

void releaseWithGil(void (*release)(void*), void* p) noexcept {
  if (PyGILState_Check()) {
    release(p);
    return;
  }
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mutex);
  try {
    q.items.push_back({release, p});
  } catch (const std::bad_alloc&) {
    return;  // out of memory: leaking one reference beats taking the GIL here
  }
  q.nonEmpty.store(true, std::memory_order_release);
}

void drainPythonReleases() noexcept {
  Queue& q = queue();
  if (!q.nonEmpty.load(std::memory_order_acquire)) return;
  std::vector<Pending> items;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    items.swap(q.items);
    q.nonEmpty.store(false, std::memory_order_relaxed);
  }
  py::error_scope keep;  // a release may run Python code (__del__); the caller's pending error survives it
  for (const Pending& item : items) item.release(item.p);
}

std::shared_ptr<void> pythonOwner(py::object obj) {
  drainPythonReleases();  // every conversion also frees what other threads dropped meanwhile
  return std::shared_ptr<void>(new py::object(std::move(obj)), [](void* p) { releaseWithGil(&deleteObject, p); });
}

}  // namespace cyxwiz::bindings
