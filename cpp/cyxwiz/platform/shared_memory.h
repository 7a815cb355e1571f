// Memory shared between the processes of one host, named so that the other ranks can map it.
// POSIX: shm_open under an unguessable name with mode 0600, unlinked as soon as every rank has
// mapped it. Windows: a named file mapping in the session's Local\ namespace, backed by the paging
// file, whose security descriptor admits only this user; it goes when the last handle closes, so a
// killed rank leaves nothing on either system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cyxwiz::platform {

class SharedMemory {
 public:
  SharedMemory() = default;
  // Reserves the space now (ENOSPC here rather than SIGBUS later). Throws cyxwiz::Error saying why.
  static SharedMemory create(size_t bytes);
  // Maps the memory `name` (as create() named it); throws saying why (absent, permission, size).
  static SharedMemory attach(const std::string& name, size_t bytes);
  ~SharedMemory();
  SharedMemory(SharedMemory&& o) noexcept { *this = std::move(o); }
  SharedMemory& operator=(SharedMemory&& o) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Removes the name (the creator's job, once every rank attached); the mapping stays. Idempotent;
  // a no-op where the name dies with its last handle (Windows).
  void unlink();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void release();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool linked_ = false;   // POSIX: we created the name and have not unlinked it yet
  void* mapping_ = nullptr;  // Windows: the file mapping's handle
};

// What the shared memory of this host is called in messages ("/dev/shm", "a named file mapping").
const char* sharedMemoryPlace();

}  // namespace cyxwiz::platform
