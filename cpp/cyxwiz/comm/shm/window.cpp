#include "cyxwiz/comm/shm/window.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/address_wait.h"
#include "cyxwiz/platform/cpu.h"
#include "cyxwiz/platform/net.h"

namespace cyxwiz::comm::shm {

namespace {

// Sleeps are cut into slices this long, between which a waiter looks at the monitor and the peer.
constexpr int64_t kSliceMs = 50;

// Phases wrap at 2^32; a peer is never 2^31 phases away.
bool reached(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

}  // namespace

Window::Window(Group& group, const CallSignature& call, Monitor* monitor, int64_t timeoutMs, const Work& work,
               std::chrono::microseconds spin, bool (*interrupted)(), const std::atomic<bool>* finalizing)
    : g_(group),
      call_(call),
      monitor_(monitor),
      timeoutMs_(timeoutMs),
      work_(work),
      spin_(spin),
      interrupted_(interrupted),
      finalizing_(finalizing) {
  encodeCall(call_, myHeader_);
}

uint8_t* Window::writable(int h, const void* like) {
  waitAll(g_.readDone[h]);
  return g_.place(h, like);
}

void Window::publish() {
  Control& c = g_.control(g_.me());
  c.phase.store(++g_.phase, std::memory_order_seq_cst);
  // A sleeper counted itself before it looked at the phase: either it sees this store or we see it.
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) platform::wakeAll(&c.phase);
}

void Window::arrive() {
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

void Window::checkHeaders() {
  for (int p = 0; p < g_.size(); ++p) {
    if (p == g_.me()) continue;
    CallSignature theirs;
    if (!decodeCall(g_.control(p).header[call_.sequence & 1], &theirs)) {
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

void Window::waitAll(uint32_t phase) {
  for (int p = 0; p < g_.size(); ++p) {
    if (p != g_.me()) waitFor(p, phase);
  }
}

void Window::waitFor(int peer, uint32_t phase) {
  Control& c = g_.control(peer);
  if (reached(c.phase.load(std::memory_order_acquire), phase)) return;
  const auto start = Clock::now();
  if (spin_.count() > 0) {
    do {
      for (int i = 0; i < 32; ++i) platform::cpuRelax();
      if (reached(c.phase.load(std::memory_order_acquire), phase)) return;
    } while (Clock::now() - start < spin_);
  }
  const Deadline deadline = start + std::chrono::milliseconds(timeoutMs_);
  for (;;) {
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t now = c.phase.load(std::memory_order_seq_cst);
    if (!reached(now, phase)) platform::waitOnAddress(&c.phase, now, std::min<int64_t>(kSliceMs, std::max(1, msUntil(deadline))));
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c.phase.load(std::memory_order_acquire), phase)) return;
    checkWhileWaiting(peer, phase, deadline);
  }
}

void Window::checkWhileWaiting(int peer, uint32_t phase, Deadline deadline) {
  if (interrupted_ != nullptr && interrupted_()) throw Interrupted(makeString(what(), ": interrupted (KeyboardInterrupt)"));
  if (finalizing_ != nullptr && finalizing_->load()) {
    throw NetworkError(makeString(what(), ": aborted: finalize() was called on another thread while this collective "
                                  "was waiting for ", g_.peerName(peer), "; finalize only after every thread's "
                                  "collectives have returned"));
  }
  if (monitor_ != nullptr && monitor_->fd() != platform::kNoSocket) {
    platform::PollFd fd = platform::pollEntry(monitor_->fd(), POLLIN);
    int err = 0;
    if (platform::pollSockets(&fd, 1, 0, &err) > 0) {
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

const uint8_t* Window::shared(int member, uint32_t buffer) const {
  // The caller's Tensor keeps the buffer alive for the call.
  auto b = g_.buffers.get(buffer);
  return b ? b->segments[static_cast<size_t>(member)].data() : nullptr;
}

}  // namespace cyxwiz::comm::shm
