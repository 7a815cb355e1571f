#include "cyxwiz/comm/shm/shm_collectives.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "cyxwiz/comm/reduce.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::shm {

namespace {

// Sleeps are cut into slices this long, between which a waiter looks at the monitor and the peer.
constexpr int64_t kSliceMs = 50;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Shared between processes: no FUTEX_PRIVATE_FLAG.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms) {
  timespec t{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000L};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &t, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Phases wrap at 2^32; a peer is never 2^31 phases away.
bool reached(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

}  // namespace

ShmCollectives::ShmCollectives(Group& group, const CallSignature& call, Monitor* monitor, int64_t timeoutMs,
                               const Work& work, std::chrono::microseconds spin, bool (*interrupted)(),
                               const std::atomic<bool>* finalizing)
    : g_(group),
      call_(call),
      monitor_(monitor),
      timeoutMs_(timeoutMs),
      work_(work),
      spin_(spin),
      interrupted_(interrupted),
      finalizing_(finalizing) {
  wire::encodeCall(call_, myHeader_);
}

uint8_t* ShmCollectives::writable(int h, const void* like) {
  waitAll(g_.readDone[h]);
  return g_.place(h, like);
}

void ShmCollectives::publish() {
  Control& c = g_.control(g_.me());
  c.phase.store(++g_.phase, std::memory_order_seq_cst);
  // A sleeper counted itself before it looked at the phase: either it sees this store or we see it.
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) futexWake(&c.phase);
}

void ShmCollectives::arrive() {
  if (!started_) {
    std::memcpy(g_.control(g_.me()).header[call_.sequence & 1], myHeader_, sizeof myHeader_);
  }
  publish();
  waitAll(g_.phase);
  if (!started_) {
    started_ = true;
    checkHeaders();
  }
}

void ShmCollectives::checkHeaders() {
  for (int p = 0; p < g_.size(); ++p) {
    if (p == g_.me()) continue;
    CallSignature theirs;
    if (!wire::decodeCall(g_.control(p).header[call_.sequence & 1], &theirs)) {
      throw BackendError(makeString(what(), ": ", g_.peerName(p), " wrote no collective header in shared memory: "
                                    "the ranks are out of step (mixed pycyxwiz versions?)"));
    }
    if (theirs != call_) {
      throw BackendError(makeString(what(), ": mismatch with rank ", g_.rank(p), ", which called ", theirs.describe(),
                                    ": every rank must call the same collectives in the same order, with the same "
                                    "dtype, element count and op"));
    }
  }
}

void ShmCollectives::waitAll(uint32_t phase) {
  for (int p = 0; p < g_.size(); ++p) {
    if (p != g_.me()) waitFor(p, phase);
  }
}

void ShmCollectives::waitFor(int peer, uint32_t phase) {
  Control& c = g_.control(peer);
  if (reached(c.phase.load(std::memory_order_acquire), phase)) return;
  const auto start = Clock::now();
  if (spin_.count() > 0) {
    do {
      for (int i = 0; i < 32; ++i) cpuRelax();
      if (reached(c.phase.load(std::memory_order_acquire), phase)) return;
    } while (Clock::now() - start < spin_);
  }
  const Deadline deadline = start + std::chrono::milliseconds(timeoutMs_);
  for (;;) {
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t now = c.phase.load(std::memory_order_seq_cst);
    if (!reached(now, phase)) futexWait(&c.phase, now, std::min<int64_t>(kSliceMs, std::max(1, msUntil(deadline))));
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c.phase.load(std::memory_order_acquire), phase)) return;
    checkWhileWaiting(peer, phase, deadline);
  }
}

void ShmCollectives::checkWhileWaiting(int peer, uint32_t phase, Deadline deadline) {
  if (interrupted_ != nullptr && interrupted_()) throw Interrupted(makeString(what(), ": interrupted (KeyboardInterrupt)"));
  if (finalizing_ != nullptr && finalizing_->load()) {
    throw NetworkError(makeString(what(), ": aborted: finalize() was called on another thread while this collective "
                                  "was waiting for ", g_.peerName(peer), "; finalize only after every thread's "
                                  "collectives have returned"));
  }
  if (monitor_ != nullptr && monitor_->fd() >= 0) {
    pollfd fd{monitor_->fd(), POLLIN, 0};
    if (::poll(&fd, 1, 0) > 0) {
      if (auto failure = monitor_->read()) raiseFailure(failure->kind, makeString(what(), ": ", noticeText(*failure)));
    }
  }
  const bool left = g_.control(peer).left.load() != 0;
  if (left || g_.peerGone(peer)) {
    // The monitor usually has the cause (it died; it failed first): give it a moment, as on TCP. That
    // moment also lets a peer that raised on its own exit before this rank's consequential error does,
    // so that launchers, which report the first rank to exit, name the cause.
    if (monitor_ != nullptr) {
      if (auto failure = monitor_->waitForNotice(Clock::now() + std::chrono::milliseconds(2000))) {
        raiseFailure(failure->kind, makeString(what(), ": ", noticeText(*failure)));
      }
    }
    throw NetworkError(makeString(what(), ": ", g_.peerName(peer), left ? " finalized or exited" : " exited",
                                  " while this rank waited for it in shared memory (phase ", phase, "): rank ",
                                  g_.rank(peer), " exited, crashed or stopped calling collectives early; every rank "
                                  "must call the same collectives in the same order"));
  }
  if (msUntil(deadline) == 0) {
    throw TimeoutError(makeString(
        what(), ": no progress from ", g_.peerName(peer), " within the timeout of ", timeoutMs_, " ms (it is at phase ",
        g_.control(peer).phase.load(), ", this rank waits for ", phase, "): rank ", g_.rank(peer),
        " is stopped, busy, or waiting on another rank that is; check that every rank calls the same collectives, "
        "or raise DISTRIBUTED_TIMEOUT_MS"));
  }
}

void ShmCollectives::allReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype), bytes = count * esz;
  auto* d = static_cast<uint8_t*>(data);
  if (bytes <= std::min(kSmallBytes, g_.halfBytes()) || count < static_cast<size_t>(g_.size())) {
    return allReduceSmall(d, count, dtype, op);
  }
  const size_t chunk = g_.halfBytes() / esz;
  for (size_t at = 0; at < count; at += chunk) allReduceChunk(d + at * esz, std::min(chunk, count - at), dtype, op);
}

void ShmCollectives::allReduceSmall(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * itemSize(dtype);
  if (bytes > g_.halfBytes()) {  // fewer elements than ranks, but huge ones: cannot happen with our dtypes
    throw BackendError(makeString(what(), ": ", bytes, " bytes do not fit a shared-memory slot"));
  }
  const int h = nextHalf();
  std::memcpy(writable(h, d), d, bytes);
  arrive();
  // Rank order on every rank: every rank ends with the same bits.
  std::memcpy(d, g_.half(0, h), bytes);
  for (int r = 1; r < g_.size(); ++r) reduceInto(d, g_.half(r, h), count, dtype, op);
  doneReading(h);
  if (op == ReduceOp::Avg) finishAverage(d, count, dtype, g_.size());
}

void ShmCollectives::allReduceChunk(uint8_t* d, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype);
  const int n = g_.size(), me = g_.me();
  auto at = [&](int r) { return partBegin(count, n, r) * esz; };
  auto len = [&](int r) { return at(r + 1) - at(r); };
  const int in = nextHalf(), out = nextHalf();
  // The peers' parts only: each rank reads its own part of the others' copies, and ours from d.
  uint8_t* copy = writable(in, d);
  for (int r = 0; r < n; ++r) {
    if (r != me) std::memcpy(copy + at(r), d + at(r), len(r));
  }
  arrive();
  // Our part, reduced in rank order into our other half, where the peers will copy it from.
  auto part = [&](int r) -> const uint8_t* { return (r == me ? d : g_.half(r, in)) + at(me); };
  uint8_t* mine = writable(out, d) + at(me);
  std::memcpy(mine, part(0), len(me));
  for (int r = 1; r < n; ++r) reduceInto(mine, part(r), len(me) / esz, dtype, op);
  if (op == ReduceOp::Avg) finishAverage(mine, len(me) / esz, dtype, n);
  std::memcpy(d + at(me), mine, len(me));
  doneReading(in);
  arrive();
  for (int r = 0; r < n; ++r) {
    if (r != me) std::memcpy(d + at(r), g_.half(r, out) + at(r), len(r));
  }
  doneReading(out);
}

void ShmCollectives::broadcast(void* data, size_t bytes, int root) {
  auto* d = static_cast<uint8_t*>(data);
  const int from = g_.localOf(root);
  size_t at = 0;
  do {  // at least one round, so that an empty broadcast still checks the call
    const size_t len = std::min(g_.halfBytes(), bytes - at);
    const int h = nextHalf();
    if (from == g_.me()) std::memcpy(writable(h, d + at), d + at, len);
    arrive();
    if (from != g_.me()) std::memcpy(d + at, g_.half(from, h), len);
    doneReading(h);
    at += len;
  } while (at < bytes);
}

void ShmCollectives::allGather(const void* in, void* out, size_t bytesPerRank) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  size_t at = 0;
  do {
    const size_t len = std::min(g_.halfBytes(), bytesPerRank - at);
    const int h = nextHalf();
    // Placed for the copies out: each peer copies it to its own array where ours goes.
    std::memcpy(writable(h, dst + static_cast<size_t>(g_.rank(g_.me())) * bytesPerRank + at), src + at, len);
    arrive();
    for (int r = 0; r < g_.size(); ++r) std::memcpy(dst + static_cast<size_t>(g_.rank(r)) * bytesPerRank + at, g_.half(r, h), len);
    doneReading(h);
    at += len;
  } while (at < bytesPerRank);
}

void ShmCollectives::reduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype), window = g_.halfBytes() / esz;
  const int n = g_.size(), me = g_.me();
  const size_t first = partBegin(count, n, me), last = partBegin(count, n, me + 1);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  size_t at = 0;
  do {
    const size_t len = std::min(window, count - at);
    const int h = nextHalf();
    std::memcpy(writable(h, src + at * esz), src + at * esz, len * esz);
    arrive();
    // The part of this window that is ours, reduced in rank order.
    const size_t from = std::max(at, first), to = std::min(at + len, last);
    if (from < to) {
      uint8_t* o = dst + (from - first) * esz;
      std::memcpy(o, g_.half(0, h) + (from - at) * esz, (to - from) * esz);
      for (int r = 1; r < n; ++r) reduceInto(o, g_.half(r, h) + (from - at) * esz, to - from, dtype, op);
    }
    doneReading(h);
    at += len;
  } while (at < count);
  if (op == ReduceOp::Avg) finishAverage(out, last - first, dtype, n);
}

void ShmCollectives::reduceScatterInPlace(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t esz = itemSize(dtype), window = g_.halfBytes() / esz;
  const int n = g_.size(), me = g_.me();
  const size_t first = partBegin(count, n, me), last = partBegin(count, n, me + 1);
  auto* d = static_cast<uint8_t*>(data);
  size_t at = 0;
  do {
    const size_t len = std::min(window, count - at);
    // Our part's share of this window, [from, to); empty at the window's edge when it lies outside.
    const size_t from = std::min(std::max(at, first), at + len), to = std::max(from, std::min(at + len, last));
    const int h = nextHalf();
    uint8_t* copy = writable(h, d + at * esz);
    std::memcpy(copy, d + at * esz, (from - at) * esz);
    std::memcpy(copy + (to - at) * esz, d + to * esz, (at + len - to) * esz);
    arrive();
    for (int r = 0; r < n; ++r) {
      if (r != me) reduceInto(d + from * esz, g_.half(r, h) + (from - at) * esz, to - from, dtype, op);
    }
    doneReading(h);
    at += len;
  } while (at < count);
  if (op == ReduceOp::Avg) finishAverage(d + first * esz, last - first, dtype, n);
}

void ShmCollectives::allGatherInPlace(void* data, size_t count, DType dtype) {
  const size_t esz = itemSize(dtype);
  const int n = g_.size(), me = g_.me();
  auto* d = static_cast<uint8_t*>(data);
  auto begin = [&](int r) { return partBegin(count, n, r) * esz; };
  const size_t largest = begin(1) - begin(0);
  size_t at = 0;
  do {
    // What of rank r's part this round carries.
    auto piece = [&](int r) {
      const size_t part = begin(r + 1) - begin(r);
      return at < part ? std::min(g_.halfBytes(), part - at) : size_t{0};
    };
    const int h = nextHalf();
    std::memcpy(writable(h, d + begin(me) + at), d + begin(me) + at, piece(me));
    arrive();
    for (int r = 0; r < n; ++r) {
      if (r != me) std::memcpy(d + begin(r) + at, g_.half(r, h), piece(r));
    }
    doneReading(h);
    at += g_.halfBytes();
  } while (at < largest);
}

}  // namespace cyxwiz::comm::shm
