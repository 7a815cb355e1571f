#include "cyxwiz/comm/shm/buffers.h"

#include <algorithm>
#include <cstring>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::shm {

namespace {

constexpr size_t kNameBytes = 128;  // what a member tells the others: its segment's name, or ""

}  // namespace

std::shared_ptr<SharedBuffer> SharedBuffers::make(Collectives& local, int members, int me, size_t bytes,
                                                  std::string* why) {
  const uint32_t id = ++made_;  // counted even when this one fails: the numbers stay equal everywhere
  auto buffer = std::make_shared<SharedBuffer>();
  buffer->id = id;
  buffer->bytes = bytes;
  buffer->segments.resize(static_cast<size_t>(members));
  Segment& mine = buffer->segments[static_cast<size_t>(me)];
  char name[kNameBytes] = {};
  try {
    mine = Segment::create(std::max<size_t>(bytes, 1));
    std::strncpy(name, mine.name().c_str(), kNameBytes - 1);
  } catch (const std::exception& e) {
    *why = e.what();
  }
  std::vector<char> names(kNameBytes * static_cast<size_t>(members));
  local.allGather(name, names.data(), kNameBytes);
  uint8_t mapped = 1;
  for (int m = 0; m < members && mapped; ++m) {
    const char* theirs = names.data() + kNameBytes * static_cast<size_t>(m);
    if (theirs[0] == '\0') {
      mapped = 0;
      if (why->empty()) *why = makeString("member ", m, " of this host could not create its segment");
    } else if (m != me) {
      try {
        buffer->segments[static_cast<size_t>(m)] = Segment::attach(std::string(theirs, strnlen(theirs, kNameBytes)),
                                                                   std::max<size_t>(bytes, 1));
      } catch (const std::exception& e) {
        mapped = 0;
        *why = e.what();
      }
    }
  }
  std::vector<uint8_t> all(static_cast<size_t>(members));
  local.allGather(&mapped, all.data(), 1);
  mine.unlink();  // every member has mapped it or given up
  if (std::find(all.begin(), all.end(), 0) != all.end()) {
    if (why->empty()) *why = "another rank of this host could not map a segment";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = live_.begin(); it != live_.end();) it = it->second.expired() ? live_.erase(it) : std::next(it);
  live_[id] = buffer;
  return buffer;
}

uint32_t SharedBuffers::find(const void* data, size_t bytes, int me) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, weak] : live_) {
    auto b = weak.lock();
    if (b && b->segments[static_cast<size_t>(me)].data() == data && b->bytes == bytes) return id;
  }
  return 0;
}

std::shared_ptr<SharedBuffer> SharedBuffers::get(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second.lock();
}

}  // namespace cyxwiz::comm::shm
