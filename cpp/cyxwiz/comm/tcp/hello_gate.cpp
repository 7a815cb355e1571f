#include "cyxwiz/comm/tcp/hello_gate.h"

#include <algorithm>
#include <cerrno>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::tcp {

namespace {

// How long the listener rests when nothing can be accepted at all (no descriptor, no spare).
constexpr std::chrono::milliseconds kAcceptPause{100};
constexpr size_t kMaxAcceptsPerRound = 256;  // then the owner's other connections get a turn
constexpr size_t kMaxHelloBytes = 4096;      // a hello is 72 bytes at most; more is a stranger's

// A quarter of the descriptors this process may open wait for hellos at most.
size_t pendingLimit() { return std::clamp<size_t>(platform::descriptorLimit() / 4, 8, 512); }

std::string ipOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

}  // namespace

struct HelloGate::Pending {
  Socket socket;
  std::string address, ip;
  AcceptorHello hello;
  std::vector<uint8_t> in;
  Deadline deadline;
  bool closed = false;
};

HelloGate::HelloGate(Socket listener, const JobIdentity& job, bool ringPort, int64_t helloTimeoutMs, std::string where)
    : listener_(std::move(listener)),
      job_(job),
      ringPort_(ringPort),
      helloTimeoutMs_(helloTimeoutMs),
      where_(std::move(where)),
      maxPending_(pendingLimit()),
      maxPerAddress_(std::max<size_t>(4, maxPending_ / 4)) {}

HelloGate::~HelloGate() { close(); }

void HelloGate::close() {
  pending_.clear();
  listener_.close();
  spare_.release();
}

void HelloGate::addPollFds(std::vector<platform::PollFd>& fds) {
  listenerPolled_ = Clock::now() >= pausedUntil_;
  if (listenerPolled_) fds.push_back(platform::pollEntry(listener_.fd(), POLLIN));
  for (auto& p : pending_) fds.push_back(platform::pollEntry(p->socket.fd(), POLLIN));
}

int HelloGate::msUntilNextDeadline() const {
  int ms = -1;
  for (auto& p : pending_) ms = ms < 0 ? msUntil(p->deadline) : std::min(ms, msUntil(p->deadline));
  if (!listenerPolled_ && (ms < 0 || ms > msUntil(pausedUntil_))) ms = msUntil(pausedUntil_);
  return ms;
}

std::vector<HelloGate::Arrival> HelloGate::handle(const platform::PollFd* fds, const Decide& decide) {
  std::vector<Arrival> admitted;
  bool listenerReady = listenerPolled_ && (fds[0].revents & POLLIN);
  const platform::PollFd* mine = fds + (listenerPolled_ ? 1 : 0);
  std::vector<std::unique_ptr<Pending>> keep;
  Deadline now = Clock::now();
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = *pending_[i];
    bool alive = true;
    if (mine[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = advance(p, decide, admitted);
    if (alive && now > p.deadline) {
      if (p.hello.challenged()) {
        logWarning(makeString(where_, ": closed a connection from ", p.address, " (rank ", p.hello.hello().rank,
                              ") that did not answer this rank's challenge (CYXWIZ_SECRET) within ", helloTimeoutMs_, " ms"));
      } else {
        logWarning(makeString(where_, ": closed a connection from ", p.address, " that sent ",
                              describeStrangerBytes(p.in.data(), p.in.size()), " and no pycyxwiz hello within ",
                              helloTimeoutMs_, " ms"));
      }
      alive = false;
    }
    if (alive) keep.push_back(std::move(pending_[i]));
  }
  pending_.swap(keep);
  if (listenerReady) acceptAll(decide, admitted);
  return admitted;
}

void HelloGate::acceptAll(const Decide& decide, std::vector<Arrival>& admitted) {
  for (size_t n = 0; n < kMaxAcceptsPerRound; ++n) {
    int err = 0;
    Socket s = listener_.acceptNow(&err);
    if (s.valid()) {
      auto p = std::make_unique<Pending>(Pending{std::move(s), "", "", AcceptorHello(job_, ringPort_), {},
                                                 deadlineAfterMs(helloTimeoutMs_)});
      p->address = p->socket.peerAddress();
      p->ip = ipOf(p->address);
      makeRoom(p->ip);
      // A rank sends its hello right after connecting: most are admitted here, before any eviction.
      if (advance(*p, decide, admitted)) pending_.push_back(std::move(p));
      continue;
    }
    if (err != EMFILE && err != ENFILE) return;  // EAGAIN: none left; anything else: try next round
    if (!pending_.empty()) {
      logEviction("this process has no file descriptor left (ulimit -n)");
      pending_.erase(pending_.begin());
      continue;
    }
    if (!shedOne()) {
      pausedUntil_ = Clock::now() + kAcceptPause;
      return;
    }
  }
}

bool HelloGate::shedOne() {
  if (!spare_.acceptAndClose(listener_.fd())) return false;
  logEviction("this process has no file descriptor left (ulimit -n): a new connection was closed at once");
  return true;
}

void HelloGate::makeRoom(const std::string& ip) {
  size_t fromIp = 0;
  for (auto& p : pending_) fromIp += p->ip == ip;
  auto oldest = pending_.end();
  if (fromIp >= maxPerAddress_) {
    oldest = std::find_if(pending_.begin(), pending_.end(), [&](auto& p) { return p->ip == ip; });
    logEviction(makeString(fromIp, " connections from ", ip, " are waiting for their hello (at most ", maxPerAddress_,
                           " per address)"));
  } else if (pending_.size() >= maxPending_) {
    oldest = pending_.begin();
    logEviction(makeString(pending_.size(), " connections are waiting for their hello (at most ", maxPending_, ")"));
  }
  if (oldest != pending_.end()) pending_.erase(oldest);
}

void HelloGate::logEviction(const std::string& why) {
  ++evicted_;
  // A flood would write a line per connection: one line a second says the same.
  if (Clock::now() < nextEvictionLog_) return;
  logWarning(makeString(where_, ": closed ", evicted_, evicted_ == 1 ? " connection" : " connections",
                        " that had not finished their hello, the oldest first: ", why,
                        "; a flood of connections from strangers, or raise ulimit -n"));
  evicted_ = 0;
  nextEvictionLog_ = Clock::now() + std::chrono::seconds(1);
}

bool HelloGate::advance(Pending& p, const Decide& decide, std::vector<Arrival>& admitted) {
  uint8_t buf[kMaxHelloBytes];
  while (p.in.size() < kMaxHelloBytes) {
    IoStatus st = p.socket.recvSome(buf, kMaxHelloBytes - p.in.size());
    if (!st.ok()) p.closed = true;
    if (!st.ok() || st.done == 0) break;
    p.in.insert(p.in.end(), buf, buf + st.done);
  }
  std::vector<uint8_t> out;
  for (;;) {
    size_t used = p.hello.feed(p.in.data(), p.in.size(), &out);
    p.in.erase(p.in.begin(), p.in.begin() + static_cast<long>(used));
    if (used == 0 || p.hello.stage() != AcceptorHello::Reading) break;
  }
  const std::string rank = p.hello.helloRead() ? makeString(" (rank ", p.hello.hello().rank, ")") : "";
  switch (p.hello.stage()) {
    case AcceptorHello::Reading:
      if (!out.empty()) p.socket.sendAll(out.data(), out.size(), Clock::now());
      if (!p.closed && p.in.size() < kMaxHelloBytes) return true;
      if (p.hello.challenged()) {
        logWarning(makeString(where_, ": refused a connection from ", p.address, rank, ": it left instead of proving the "
                              "shared secret: its CYXWIZ_SECRET differs from this rank's (it found this rank's proof "
                              "wrong), or it is not a rank of this job"));
      } else {
        logWarning(makeString(where_, ": a connection from ", p.address, " closed without a pycyxwiz hello (it sent ",
                              describeStrangerBytes(p.in.data(), p.in.size()), "): a port scan, or a process of another program"));
      }
      return false;
    case AcceptorHello::Stranger:
      logWarning(makeString(where_, ": refused a connection from ", p.address, ": ", p.hello.reason()));
      return false;
    case AcceptorHello::Refused:
      logWarning(makeString(where_, ": refused a connection from ", p.address, rank, ": ", p.hello.reason()));
      p.socket.sendAll(out.data(), out.size(), Clock::now());
      return false;
    case AcceptorHello::Proven: break;
  }
  bool later = false;
  std::string refusal = decide(p.hello.hello(), p.address, &later);
  p.hello.finish(refusal, later, &out);
  IoStatus st = p.socket.sendAll(out.data(), out.size(), Clock::now());
  if (!refusal.empty()) {
    if (later) {
      logDebug(makeString(where_, ": asked ", p.address, rank, " to come back: ", refusal));
    } else {
      logWarning(makeString(where_, ": refused a connection from ", p.address, rank, ": ", refusal));
    }
    return false;
  }
  if (!st.ok()) return false;  // it left before the welcome
  admitted.push_back(Arrival{std::move(p.socket), p.hello.hello(), p.address, std::move(p.in)});
  return false;
}

}  // namespace cyxwiz::comm::tcp
