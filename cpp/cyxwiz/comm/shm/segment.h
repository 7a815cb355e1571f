// A POSIX shared-memory segment under /dev/shm: created with an unguessable name and mode 0600,
// attached by name by the other ranks of the host, and unlinked as soon as they all have, so that no
// file outlives the job, even one whose ranks are all killed. The mapping stays until destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cyxwiz::comm::shm {

class Segment {
 public:
  Segment() = default;
  // Name "/cyxwiz-<pid>-<64 random bits>"; the space is reserved (ENOSPC now, not SIGBUS later).
  static Segment create(size_t bytes);
  // Error saying why (absent, permission, wrong size) when it cannot be mapped.
  static Segment attach(const std::string& name, size_t bytes);
  ~Segment();
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Removes the name (the creator's job); the mapping stays valid. Idempotent.
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
  bool linked_ = false;  // we created it and have not unlinked it yet
};

// 16 random bytes as 32 hex digits (getrandom).
std::string randomHex(size_t bytes);

}  // namespace cyxwiz::comm::shm
