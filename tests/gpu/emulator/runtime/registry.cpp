// TEST DOUBLE, NOT GPU SUPPORT. The registry of everything emulated device work may touch: device
// allocations (cudaMalloc, the pools, graph memory), pinned host buffers and "foreign" allocations of
// another library (test hooks). Device memory is host memory. Fresh and freed blocks are filled with
// 0xFF (NaN as float32, -1 as integers). A freed block is not returned at once: it stays, poisoned and
// marked freed, in a quarantine (CYXWIZ_EMULATED_QUARANTINE_MB, default 256 MiB, oldest released
// first), so that its address is not handed out again while a stale use of it can still be caught.
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "internal.h"

namespace cxemu {

namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment

struct Block {
  BlockInfo info;
  void* mem = nullptr;
};

struct Registry {
  std::mutex m;
  std::map<uintptr_t, Block> blocks;  // by base
  std::deque<uintptr_t> quarantine;   // freed bases, oldest first
  size_t quarantineBytes = 0;
};

Registry& reg() {
  static Registry* r = new Registry;  // never destroyed (workers may outlive main)
  return *r;
}

size_t quarantineLimit() {
  static const size_t limit = size_t(envInt("CYXWIZ_EMULATED_QUARANTINE_MB", 256, 0, 1 << 20)) << 20;
  return limit;
}

Block* containingLocked(Registry& r, uintptr_t p) {
  auto it = r.blocks.upper_bound(p);
  if (it == r.blocks.begin()) return nullptr;
  --it;
  Block& b = it->second;
  if (p >= b.info.base && p - b.info.base < b.info.bytes) return &b;
  return nullptr;
}

void trimQuarantineLocked(Registry& r) {
  while (r.quarantineBytes > quarantineLimit() && !r.quarantine.empty()) {
    const uintptr_t base = r.quarantine.front();
    r.quarantine.pop_front();
    auto it = r.blocks.find(base);
    if (it == r.blocks.end() || it->second.info.state != BlockState::Freed) continue;
    r.quarantineBytes -= it->second.info.bytes;
    std::free(it->second.mem);
    r.blocks.erase(it);
  }
}

const char* kindName(BlockKind k) {
  switch (k) {
    case BlockKind::Device: return "device memory";
    case BlockKind::Pinned: return "pinned host memory";
    case BlockKind::Foreign: return "foreign device memory";
    case BlockKind::Graph: return "graph memory";
  }
  return "memory";
}

}  // namespace

void* blockCreate(size_t bytes, int dev, BlockKind kind, BlockState state, PoolKind pool, void* poolHandle,
                  const std::string& note) {
  if (bytes == 0) return nullptr;
  const size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (padded < bytes) return nullptr;
  void* mem = std::aligned_alloc(kAlign, padded);
  if (!mem) return nullptr;
  std::memset(mem, 0xFF, padded);
  Block b;
  b.mem = mem;
  b.info.base = reinterpret_cast<uintptr_t>(mem);
  b.info.bytes = bytes;
  b.info.dev = dev;
  b.info.kind = kind;
  b.info.state = state;
  b.info.pool = pool;
  b.info.poolHandle = poolHandle;
  b.info.note = note;
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  r.blocks[b.info.base] = b;  // replaces the entry of a block released from quarantine at this address
  return mem;
}

bool blockAt(const void* p, BlockInfo* out) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.blocks.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.blocks.end()) return false;
  if (out) *out = it->second.info;
  return true;
}

bool blockContaining(const void* p, BlockInfo* out) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  Block* b = containingLocked(r, reinterpret_cast<uintptr_t>(p));
  if (!b) return false;
  if (out) *out = b->info;
  return true;
}

bool blockSetState(const void* base, BlockState state, const std::string& note) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.blocks.find(reinterpret_cast<uintptr_t>(base));
  if (it == r.blocks.end()) return false;
  Block& b = it->second;
  const BlockState old = b.info.state;
  b.info.state = state;
  if (!note.empty()) b.info.note = note;
  if (state == BlockState::Freed || state == BlockState::Reserved ||
      (state == BlockState::Live && old == BlockState::Reserved)) {
    std::memset(b.mem, 0xFF, b.info.bytes);
  }
  if (state == BlockState::Live || state == BlockState::Freed) b.info.freeQueued = false;
  if (state == BlockState::Freed && old != BlockState::Freed) {
    r.quarantine.push_back(b.info.base);
    r.quarantineBytes += b.info.bytes;
    trimQuarantineLocked(r);
  }
  return true;
}

bool blockSetFreeQueued(const void* base, bool queued) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.blocks.find(reinterpret_cast<uintptr_t>(base));
  if (it == r.blocks.end()) return false;
  it->second.info.freeQueued = queued;
  return true;
}

bool blockSetKind(const void* base, BlockKind kind) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.blocks.find(reinterpret_cast<uintptr_t>(base));
  if (it == r.blocks.end()) return false;
  it->second.info.kind = kind;
  return true;
}

bool deviceRange(const void* p, size_t bytes, int dev, bool pendingCounts) {
  if (!p) return false;
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const Block* b = containingLocked(r, a);
  if (!b || b->info.kind == BlockKind::Pinned) return false;
  if (b->info.state != BlockState::Live && !(pendingCounts && b->info.state == BlockState::Pending)) return false;
  if (dev >= 0 && b->info.dev != dev) return false;
  return bytes <= b->info.bytes - (a - b->info.base);
}

bool accessOk(const Access& acc, int dev, bool peer, std::string* why) {
  if (acc.bytes == 0) return true;
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  const uintptr_t a = reinterpret_cast<uintptr_t>(acc.ptr);
  const Block* b = acc.ptr ? containingLocked(r, a) : nullptr;
  if (!b) {
    *why = "outside any allocation";
    return false;
  }
  const BlockInfo& i = b->info;
  const std::string what = std::string(kindName(i.kind)) + " at " + hexPtr(reinterpret_cast<void*>(i.base)) + " (" +
                           std::to_string(i.bytes) + " bytes)";
  switch (i.state) {
    case BlockState::Live: break;
    case BlockState::Freed: *why = "in " + what + " " + (i.note.empty() ? "freed" : i.note); return false;
    case BlockState::Pending:
      *why = "in " + what + " allocated by " + i.note + ", which had not reached the allocation yet";
      return false;
    case BlockState::Reserved:
      *why = "in " + what + " outside its live span in a graph replay (" + (i.note.empty() ? "not allocated" : i.note) + ")";
      return false;
  }
  if (acc.bytes > i.bytes - (a - i.base)) {
    *why = "running past the end of " + what;
    return false;
  }
  if (!peer && i.kind != BlockKind::Pinned && i.dev != dev) {
    *why = "in " + what + " of cuda:" + std::to_string(i.dev) + " (peer access is not enabled)";
    return false;
  }
  return true;
}

size_t liveBytes(int dev, void* poolHandle) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.m);
  size_t n = 0;
  for (const auto& kv : r.blocks) {
    const BlockInfo& i = kv.second.info;
    if (i.dev == dev && (!poolHandle || i.poolHandle == poolHandle) &&
        (i.state == BlockState::Live || i.state == BlockState::Pending)) {
      n += i.bytes;
    }
  }
  return n;
}

}  // namespace cxemu

namespace cxemu {

bool isPinnedRange(const void* ptr, size_t bytes) {
  BlockInfo i;
  if (!ptr || !blockContaining(ptr, &i) || i.kind != BlockKind::Pinned || i.state != BlockState::Live) return false;
  return bytes <= i.bytes - (reinterpret_cast<uintptr_t>(ptr) - i.base);
}

}  // namespace cxemu
