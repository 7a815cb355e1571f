#include "cyxwiz/comm/tcp/duplex.h"

#include <algorithm>
#include <cerrno>
#include <climits>

namespace cyxwiz::comm::tcp {

namespace {

constexpr int kMaxIov = 64;

// Progress through a list of buffers.
class Cursor {
 public:
  explicit Cursor(const std::vector<platform::IoVec>& v) : v_(v) {
    for (const auto& e : v) total_ += e.iov_len;
  }
  size_t done() const { return done_; }
  size_t total() const { return total_; }
  bool finished() const { return done_ == total_; }

  // The buffers covering [done, limit).
  int fill(platform::IoVec* out, size_t limit) const {
    int n = 0;
    size_t idx = idx_, off = off_, budget = limit - done_;
    while (idx < v_.size() && n < kMaxIov && budget > 0) {
      size_t len = std::min(v_[idx].iov_len - off, budget);
      if (len > 0) out[n++] = {static_cast<char*>(v_[idx].iov_base) + off, len};
      budget -= len;
      ++idx;
      off = 0;
    }
    return n;
  }

  void advance(size_t k) {
    done_ += k;
    while (k > 0 || (idx_ < v_.size() && v_[idx_].iov_len == off_)) {
      size_t len = v_[idx_].iov_len - off_;
      if (k < len) {
        off_ += k;
        return;
      }
      k -= len;
      ++idx_;
      off_ = 0;
    }
  }

 private:
  const std::vector<platform::IoVec>& v_;
  size_t total_ = 0, done_ = 0, idx_ = 0, off_ = 0;
};

bool wouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

// Milliseconds from `now` to `deadline`, clamped to [0, INT_MAX] for poll().
int msBetween(Clock::time_point now, Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
  return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

}  // namespace

Duplex::Duplex(Pair* left, Pair* right, Monitor* monitor, Deadline deadline, int64_t timeoutMs, const Work& work,
               std::chrono::microseconds spin, bool (*interrupted)(), const std::atomic<bool>* finalizing)
    : left_(left),
      right_(right),
      monitor_(monitor),
      deadline_(deadline),
      timeoutMs_(timeoutMs),
      work_(work),
      spin_(spin),
      interrupted_(interrupted),
      finalizing_(finalizing) {}

void Duplex::run(Step& step) {
  Cursor out(step.send), in(step.recv);
  const size_t header = step.recvHeaderBytes;
  bool headerSeen = header == 0;
  size_t handedOn = 0;  // payload bytes passed to onReceived
  auto payloadIn = [&] { return in.done() > header ? in.done() - header : 0; };
  auto sendLimit = [&] {
    if (step.relay) return std::min(out.total(), step.sendHeaderBytes + payloadIn());
    if (step.sendAvailable) return std::min(out.total(), step.sendHeaderBytes + step.sendAvailable(handedOn));
    return out.total();
  };
  platform::IoVec iov[kMaxIov];
  Deadline idleSince{};

  while (!out.finished() || !in.finished()) {
    bool moved = false;
    const size_t limit = sendLimit();
    if (out.done() < limit) {
      int err = 0;
      int64_t k = platform::sendGathered(right_->socket.fd(), iov, out.fill(iov, limit), &err);
      if (k > 0) {
        out.advance(static_cast<size_t>(k));
        moved = true;
      } else if (k < 0 && !wouldBlock(err)) {
        peerLost(*right_, false, err, out.done(), out.total());
      }
    }
    if (!in.finished()) {
      int err = 0;
      int64_t k = platform::recvScattered(left_->socket.fd(), iov, in.fill(iov, in.total()), &err);
      if (k > 0) {
        in.advance(static_cast<size_t>(k));
        moved = true;
        if (!headerSeen && in.done() >= header) {
          headerSeen = true;
          if (step.onHeader) step.onHeader();
        }
        if (headerSeen && step.onReceived) {
          size_t ready = in.finished() ? payloadIn() : payloadIn() / step.unit * step.unit;
          bool boundary = handedOn < step.flushAt && ready >= step.flushAt;
          if (ready > handedOn && (ready - handedOn >= step.grain || in.finished() || boundary)) {
            step.onReceived(handedOn, ready);
            handedOn = ready;
          }
        }
      } else if (k == 0) {
        peerLost(*left_, true, 0, in.done(), in.total());
      } else if (!wouldBlock(err)) {
        peerLost(*left_, true, err, in.done(), in.total());
      }
    }
    if (moved) {
      idleSince = Deadline{};
      progressed_ = true;
      continue;
    }
    // Spin briefly before sleeping in poll(): a wake-up costs more than a small message's flight.
    if (spin_.count() > 0) {
      auto now = Clock::now();
      if (idleSince == Deadline{}) idleSince = now;
      if (now - idleSince < spin_) continue;
    }

    platform::PollFd fds[3];
    int n = 0, monitorAt = -1;
    if (out.done() < sendLimit()) fds[n++] = platform::pollEntry(right_->socket.fd(), POLLOUT);
    if (!in.finished()) fds[n++] = platform::pollEntry(left_->socket.fd(), POLLIN);
    if (monitor_ != nullptr && monitor_->fd() != platform::kNoSocket) {
      monitorAt = n;
      fds[n++] = platform::pollEntry(monitor_->fd(), POLLIN);
    }
    const auto now = Clock::now();
    if (progressed_) {
      progressed_ = false;
      deadline_ = now + std::chrono::milliseconds(timeoutMs_);
    }
    int wait = msBetween(now, deadline_);
    if (interrupted_ != nullptr && wait > 100) wait = 100;
    int pollErr = 0;
    int rc = wait > 0 ? platform::pollSockets(fds, static_cast<size_t>(n), wait, &pollErr) : 0;
    if (interrupted_ != nullptr && interrupted_()) {
      throw Interrupted(makeString(what(), ": interrupted (KeyboardInterrupt)"));
    }
    if (rc == 0 && msUntil(deadline_) == 0) {
      bool receiving = !in.finished();
      timedOut(receiving, receiving ? in.done() : out.done(), receiving ? in.total() : out.total());
    }
    if (rc > 0 && monitorAt >= 0 && fds[monitorAt].revents != 0) checkMonitor();
  }
}

void Duplex::checkMonitor() {
  if (auto failure = monitor_->read()) raiseNotice(*failure);
}

void Duplex::raiseNotice(const Failure& failure) { raiseFailure(failure.kind, makeString(what(), ": ", noticeText(failure))); }

void Duplex::peerLost(const Pair& peer, bool receiving, int err, size_t done, size_t total) {
  if (finalizing_ != nullptr && finalizing_->load()) {
    throw NetworkError(makeString(what(), ": aborted: finalize() was called on another thread while this collective "
                                  "was running (it was ", receiving ? "receiving from " : "sending to ", peer.name(),
                                  "); finalize only after every thread's collectives have returned"));
  }
  // The kernel gave up on the peer's machine (TCP_USER_TIMEOUT, keepalive, no route): not a process exit.
  if (isUnreachableError(err)) unreachable(peer, receiving, errnoString(err), done, total);
  // The monitor usually knows why the peer went away (it died; it failed first): wait a moment for
  // that, so that every rank reports the same first cause.
  if (monitor_ != nullptr) {
    // Not bounded by this collective's deadline: a neighbour that closed because it timed out does
    // so at about the same moment as ours would pass, and its notice is the better explanation.
    if (auto failure = monitor_->waitForNotice(Clock::now() + std::chrono::milliseconds(2000))) {
      raiseNotice(*failure);
    }
  }
  std::string how = err == 0 ? "closed the connection" : "reset the connection (" + errnoString(err) + ")";
  throw NetworkError(makeString(what(), ": ", peer.name(), " ", how, " while this rank was ",
                                receiving ? "receiving from it" : "sending to it", " (", done, " of ", total,
                                " bytes of this step): rank ", peer.rank, " exited, crashed or stopped calling "
                                "collectives early; every rank must call the same collectives in the same order"));
}

void Duplex::timedOut(bool receiving, size_t done, size_t total) {
  const Pair& peer = receiving ? *left_ : *right_;
  // A peer that is stopped or busy still has a kernel that acknowledges; a cut cable does not (and
  // has been silent for about the timeout, unlike a probe that is merely in flight).
  const Pair* other = receiving ? right_ : left_;
  for (const Pair* p : {&peer, other}) {
    int64_t silentMs = 0;
    if (p->socket.peerUnresponsive(&silentMs) && silentMs >= timeoutMs_ / 2) {
      unreachable(*p, p == left_, makeString("its machine acknowledged nothing for ", silentMs, " ms"), done, total);
    }
  }
  throw TimeoutError(makeString(
      what(), ": ", receiving ? "no data from " : "no progress sending to ", peer.name(), " within the timeout of ",
      timeoutMs_, " ms (", done, " of ", total, " bytes of this step): rank ", peer.rank,
      " is stopped, busy, or waiting on another rank that is; check that every rank calls the same collectives, "
      "or raise DISTRIBUTED_TIMEOUT_MS"));
}

void Duplex::unreachable(const Pair& peer, bool receiving, const std::string& why, size_t done, size_t total) {
  throw NetworkError(makeString(what(), ": rank ", peer.rank, " at ", peer.address, " unreachable: ", why, " while this rank was ",
                                receiving ? "receiving from it" : "sending to it", " (", done, " of ", total,
                                " bytes of this step): a cut cable, a machine that is down or a firewall that drops "
                                "the traffic; check the network between this machine and ", peer.address));
}

}  // namespace cyxwiz::comm::tcp
