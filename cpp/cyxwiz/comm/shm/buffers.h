// Shared buffers: memory a rank allocates for a collective it repeats (DDP's gradient buckets) in a
// segment of its own that every rank of its host maps. An all_reduce of such a buffer reads the
// peers' data where it lies (window_collectives.h) instead of copying it into the group's slots
// first: about half the memory traffic of a large all_reduce.
//
// Making one is collective (every rank of the host, in the same order, the same size), so the n-th
// buffer has the same number everywhere, which the call header carries. Each rank's segment is
// unlinked once every rank has mapped it; the memory goes when the last mapping does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/shm/segment.h"

namespace cyxwiz::comm::shm {

struct SharedBuffer {
  uint32_t id = 0;
  size_t bytes = 0;
  std::vector<Segment> segments;  // every member's, by member, mapped here
};

class SharedBuffers {
 public:
  // A new buffer of `bytes`, zeroed, made with the host's collectives `local` (a collective call:
  // every member makes the same one), or null when some member could not create or map its segment
  // (/dev/shm full: then every member gets null, and *why says what happened first here).
  std::shared_ptr<SharedBuffer> make(Collectives& local, int members, int me, size_t bytes, std::string* why);
  // The number of the live buffer that [data, data + bytes) is exactly this member's copy of, or 0.
  uint32_t find(const void* data, size_t bytes, int me) const;
  // The live buffer with this number, or null.
  std::shared_ptr<SharedBuffer> get(uint32_t id) const;

 private:
  mutable std::mutex mutex_;  // make() runs on the communication thread, find() on the caller's
  std::map<uint32_t, std::weak_ptr<SharedBuffer>> live_;
  uint32_t made_ = 0;
};

}  // namespace cyxwiz::comm::shm
