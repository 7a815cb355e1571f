#include "cyxwiz/platform/shared_memory.h"

#include <utility>

// What every system shares; creating, attaching and releasing are in posix/ and windows/.
namespace cyxwiz::platform {

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    linked_ = std::exchange(o.linked_, false);
    mapping_ = std::exchange(o.mapping_, nullptr);
  }
  return *this;
}

SharedMemory::~SharedMemory() { release(); }

}  // namespace cyxwiz::platform
