#include "cyxwiz/comm/store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <set>
#include <memory>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm {

namespace {

constexpr size_t kMaxKeyBytes = 4096;
constexpr std::chrono::milliseconds kTimeoutVerdictWindow{1000};
constexpr uint64_t kMaxValueBytes = 64ull << 20;

int64_t toInteger(const std::string& s) {
  try {
    return s.empty() ? 0 : std::stoll(s);
  } catch (const std::exception&) {
    return 0;  // add() on a key that holds text starts from 0, as a counter would
  }
}

struct Connection {
  enum State { Handshake, Store, Monitor } state = Handshake;
  Socket socket;
  std::string address;
  int rank = -1;
  Deadline helloDeadline;
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  bool closeAfterFlush = false;
  bool saidGoodbye = false;
  bool dead = false;
};

// The loop's state; lives on the server thread only.
class Loop {
 public:
  Loop(const JobIdentity& job, int64_t handshakeTimeoutMs) : job_(job), handshakeTimeoutMs_(handshakeTimeoutMs) {}

  void accept(Socket s) {
    auto c = std::make_unique<Connection>();
    c->address = s.peerAddress();
    c->socket = std::move(s);
    c->helloDeadline = deadlineAfterMs(handshakeTimeoutMs_);
    conns_.push_back(std::move(c));
  }

  std::vector<std::unique_ptr<Connection>>& connections() { return conns_; }

  void onReadable(Connection& c) {
    uint8_t buf[65536];
    bool closed = false;
    for (;;) {
      IoStatus st = c.socket.recvSome(buf, sizeof buf);
      if (!st.ok()) {
        closed = true;
        break;
      }
      if (st.done == 0) break;
      c.in.insert(c.in.end(), buf, buf + st.done);
      if (st.done < sizeof buf) break;
    }
    // Requests that arrived just before the close still count (a goodbye, then exit).
    while (!c.dead && !c.closeAfterFlush && parseOne(c)) {
    }
    if (closed) lost(c);
  }

  void onWritable(Connection& c) {
    while (!c.out.empty()) {
      IoStatus st = c.socket.sendAll(c.out.data(), c.out.size(), Clock::now());
      c.out.erase(c.out.begin(), c.out.begin() + static_cast<long>(st.done));
      if (st.kind == IoStatus::TimedOut) return;  // kernel buffer full: poll for POLLOUT again
      if (!st.ok()) return lost(c);
    }
    if (c.closeAfterFlush) c.dead = true;
  }

  void expireSilent() {
    for (auto& c : conns_) {
      if (c->state == Connection::Handshake && !c->dead && !c->closeAfterFlush && Clock::now() > c->helloDeadline) {
        logWarning(makeString("rendezvous: closed a connection from ", c->address, " that sent ",
                              describeStrangerBytes(c->in.data(), c->in.size()), " and no pycyxwiz hello within ",
                              handshakeTimeoutMs_, " ms"));
        c->dead = true;
      }
    }
  }

  void sweep() {
    std::vector<std::unique_ptr<Connection>> keep;
    for (auto& c : conns_) {
      if (!c->dead) keep.push_back(std::move(c));
    }
    conns_.swap(keep);
  }

  void shutdown() {
    for (auto& c : conns_) {
      if (c->state == Connection::Monitor && !c->dead) {
        send(*c, frame(static_cast<uint8_t>(wire::Notice::Shutdown), 0, 0, ""));
        onWritable(*c);
      }
    }
  }

 private:
  static std::vector<uint8_t> frame(uint8_t type, uint8_t kind, uint32_t word, const std::string& payload) {
    std::vector<uint8_t> out(wire::kFrameBytes + payload.size());
    wire::encodeFrame({type, kind, word, payload.size()}, out.data());
    std::memcpy(out.data() + wire::kFrameBytes, payload.data(), payload.size());
    return out;
  }

  void send(Connection& c, const std::vector<uint8_t>& bytes) {
    c.out.insert(c.out.end(), bytes.begin(), bytes.end());
    onWritable(c);
  }

  void reply(Connection& c, const std::string& value) { send(c, frame(0, 0, 0, value)); }

  // A connection ended. A monitor that never said goodbye means its rank died: tell the others.
  void lost(Connection& c) {
    if (c.dead) return;
    c.dead = true;
    if (c.state == Connection::Handshake && !c.closeAfterFlush) {
      logWarning(makeString("rendezvous: a connection from ", c.address, " closed without a pycyxwiz hello (it sent ",
                            describeStrangerBytes(c.in.data(), c.in.size()), "): a port scan, or a process of another program"));
    }
    // A rank that reported its failure and then left is not news; one that just vanished is.
    if (c.state == Connection::Monitor && !c.saidGoodbye && !reported_.count(c.rank)) {
      abortJob(c.rank, wire::ErrorKind::Network,
               makeString("rank ", c.rank, " (", c.address, ") died: its connection to the rendezvous on rank 0 closed "
                          "without finalize (the process crashed, was killed, or exited before the others)"));
    }
    for (auto& [key, waiters] : waiters_) {
      for (auto& w : waiters) {
        if (w == &c) w = nullptr;
      }
    }
  }

  // `toOrigin`: the origin gets the notice too (a timeout verdict adds to what it knew).
  void abortJob(int origin, wire::ErrorKind kind, const std::string& message, bool toOrigin = false) {
    if (aborted_) return;  // the first failure is the cause; later ones are its echoes
    aborted_ = true;
    timeout_.active = false;
    auto notice = frame(static_cast<uint8_t>(wire::Notice::Abort), static_cast<uint8_t>(kind), static_cast<uint32_t>(origin), message);
    for (auto& other : conns_) {
      if (other->state == Connection::Monitor && !other->dead && (toOrigin || other->rank != origin)) send(*other, notice);
    }
  }

  // A timeout is not told at once: the ranks stuck in the same collective report theirs within
  // moments, and the rank that does not report is the one that is stopped or hung. The verdict
  // names it (the first reporter usually names only the neighbour it waited on).
  void reportTimeout(int origin, const std::string& message) {
    if (aborted_) return;
    if (!timeout_.active) timeout_ = {true, origin, message, Clock::now() + kTimeoutVerdictWindow, {}};
    timeout_.reporters.insert(origin);
  }

 public:
  bool timeoutPending() const { return timeout_.active; }

  // `now`: the server is stopping; tell what is known.
  void decideTimeout(bool now = false) {
    if (!timeout_.active) return;
    std::set<int> silent;
    for (auto& c : conns_) {
      if (c->state == Connection::Monitor && !c->dead && !timeout_.reporters.count(c->rank)) silent.insert(c->rank);
    }
    if (!now && !silent.empty() && Clock::now() < timeout_.until) return;
    std::string verdict = timeout_.message;
    if (!silent.empty()) {
      std::string list;
      for (int r : silent) list += (list.empty() ? "" : ", ") + std::to_string(r);
      verdict += makeString(" [rank", silent.size() > 1 ? "s " : " ", list, silent.size() > 1 ? " do" : " does",
                            " not report a timeout of its own: stopped, hung, or busy outside collectives]");
    }
    abortJob(timeout_.origin, wire::ErrorKind::Timeout, verdict, true);
  }

 private:
  bool parseOne(Connection& c) {
    if (c.state == Connection::Handshake) return parseHello(c);
    if (c.in.size() < wire::kFrameBytes) return false;
    wire::Frame f = wire::decodeFrame(c.in.data());
    if (f.word > kMaxKeyBytes || f.length > kMaxValueBytes) {
      logWarning(makeString("rendezvous: rank ", c.rank, " (", c.address, ") sent a malformed request; closing it"));
      lost(c);
      return false;
    }
    size_t total = wire::kFrameBytes + f.word + f.length;
    if (c.in.size() < total) return false;
    std::string key(reinterpret_cast<const char*>(c.in.data()) + wire::kFrameBytes, f.word);
    std::string value(reinterpret_cast<const char*>(c.in.data()) + wire::kFrameBytes + f.word, f.length);
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<long>(total));
    handle(c, static_cast<wire::StoreOp>(f.type), f.kind, key, value);
    return true;
  }

  void handle(Connection& c, wire::StoreOp op, uint8_t kind, const std::string& key, const std::string& value) {
    switch (op) {
      case wire::StoreOp::Set: {
        data_[key] = value;
        reply(c, "");
        auto it = waiters_.find(key);
        if (it != waiters_.end()) {
          for (Connection* w : it->second) {
            if (w != nullptr && !w->dead) reply(*w, value);
          }
          waiters_.erase(it);
        }
        return;
      }
      case wire::StoreOp::Get: {
        auto it = data_.find(key);
        if (it != data_.end()) return reply(c, it->second);
        waiters_[key].push_back(&c);
        return;
      }
      case wire::StoreOp::Check: return reply(c, data_.count(key) ? "1" : "0");
      case wire::StoreOp::Add: {
        int64_t now = toInteger(data_[key]) + toInteger(value);
        data_[key] = std::to_string(now);
        return reply(c, data_[key]);
      }
      case wire::StoreOp::Abort:
        reported_.insert(c.rank);
        if (static_cast<wire::ErrorKind>(kind) == wire::ErrorKind::Timeout) return reportTimeout(c.rank, value);
        return abortJob(c.rank, static_cast<wire::ErrorKind>(kind), value);
      case wire::StoreOp::Goodbye: c.saidGoodbye = true; return;
    }
    logWarning(makeString("rendezvous: rank ", c.rank, " (", c.address, ") sent an unknown request; closing it"));
    lost(c);
  }

  bool parseHello(Connection& c) {
    size_t have = c.in.size() < 8 ? c.in.size() : 8;
    if (std::memcmp(c.in.data(), wire::kHelloMagic, have) != 0) {
      logWarning(makeString("rendezvous: refused a connection from ", c.address, ": not a pycyxwiz peer (it sent ",
                            describeStrangerBytes(c.in.data(), c.in.size()), ")"));
      c.dead = true;
      return false;
    }
    if (c.in.size() < wire::kHelloBytes) return false;
    wire::Hello hello;
    wire::decodeHello(c.in.data(), &hello);
    size_t length = wire::kHelloBytes + ((hello.flags & wire::kHelloHasProof) ? wire::kProofBytes : 0);
    if (c.in.size() < length) return false;
    wire::Channel channel = hello.channel == wire::Channel::Monitor ? wire::Channel::Monitor : wire::Channel::Store;
    std::string refusal = checkHello(hello, channel, job_);
    if (refusal.empty()) {
      refusal = checkProof(c.in.data(), hello, length > wire::kHelloBytes ? c.in.data() + wire::kHelloBytes : nullptr, job_.secret);
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<long>(length));
    if (refusal.empty()) {
      for (auto& other : conns_) {
        if (other.get() != &c && !other->dead && other->state != Connection::Handshake &&
            other->rank == static_cast<int>(hello.rank) &&
            (other->state == Connection::Monitor) == (channel == wire::Channel::Monitor)) {
          refusal = makeString("rank ", hello.rank, " has already joined from ", other->address,
                               ": two processes were given the same rank");
        }
      }
    }
    bool later = false;
    if (refusal.empty()) {
      refusal = checkGeneration(hello, job_);
      later = !refusal.empty();
    }
    if (!refusal.empty()) {
      if (later) {
        logDebug(makeString("rendezvous: asked ", c.address, " (rank ", hello.rank, ") to come back: ", refusal));
      } else {
        logWarning(makeString("rendezvous: refused a connection from ", c.address, " (rank ", hello.rank, "): ", refusal));
      }
      c.closeAfterFlush = true;
      send(c, encodeHelloReply(refusal, later));
      return false;
    }
    c.rank = static_cast<int>(hello.rank);
    c.state = channel == wire::Channel::Monitor ? Connection::Monitor : Connection::Store;
    send(c, std::vector<uint8_t>(8, 0));
    if (c.state == Connection::Monitor && aborted_) {
      // Joined after the job already failed: it must not start working.
      send(c, frame(static_cast<uint8_t>(wire::Notice::Abort), static_cast<uint8_t>(wire::ErrorKind::Network), 0,
                    "the job failed before this rank joined"));
    }
    return true;
  }

  JobIdentity job_;
  int64_t handshakeTimeoutMs_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::vector<Connection*>> waiters_;
  bool aborted_ = false;
  std::set<int> reported_;  // ranks that told us why they stop
  struct PendingTimeout {
    bool active = false;
    int origin = -1;
    std::string message;
    Deadline until;
    std::set<int> reporters;
  } timeout_;
};

}  // namespace

StoreServer::StoreServer(int port, int span, const JobIdentity& job, int64_t handshakeTimeoutMs)
    : port_(port), job_(job), handshakeTimeoutMs_(handshakeTimeoutMs) {
  int err = 0;
  for (int p = port; p < port + span && !listener_.valid(); ++p) listener_ = Socket::listenAny(p, 1024, &err);
  if (!listener_.valid()) {
    std::string why = err == EADDRINUSE
                          ? "another job, or a process left over from an earlier run, is using it: stop it, or choose "
                            "a free port with MASTER_PORT (the same on every rank); the launcher picks a free port by "
                            "itself when MASTER_PORT is not set"
                          : "check MASTER_PORT (ports below 1024 need privileges)";
    std::string ports = span > 1 ? makeString("ports ", port, "-", port + span - 1) : makeString("port ", port);
    throw NetworkError(makeString(rankPrefix(), "init: rank 0 cannot serve the rendezvous on ", ports, ": ",
                                  errnoString(err), "; ", why));
  }
  port_ = listener_.localPort();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw NetworkError(makeString("init: pipe failed: ", errnoString(errno)));
  wakeRead_ = fds[0];
  wakeWrite_ = fds[1];
  thread_ = std::thread([this] { run(); });
}

StoreServer::~StoreServer() {
  stop();
  if (wakeRead_ >= 0) ::close(wakeRead_);
  if (wakeWrite_ >= 0) ::close(wakeWrite_);
}

void StoreServer::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  char b = 1;
  (void)!::write(wakeWrite_, &b, 1);
  thread_.join();
  listener_.close();
}

void StoreServer::run() {
  Loop loop(job_, handshakeTimeoutMs_);
  std::vector<pollfd> fds;
  while (!stopping_) {
    auto& conns = loop.connections();
    fds.assign({{listener_.fd(), POLLIN, 0}, {wakeRead_, POLLIN, 0}});
    for (auto& c : conns) fds.push_back({c->socket.fd(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    int rc = ::poll(fds.data(), fds.size(), loop.timeoutPending() ? 20 : 200);
    if (rc < 0 && errno != EINTR) break;
    if (rc > 0) {
      for (size_t i = 0; i < conns.size(); ++i) {
        short ev = fds[i + 2].revents;
        if (ev & POLLOUT) loop.onWritable(*conns[i]);
        if (ev & (POLLIN | POLLHUP | POLLERR)) loop.onReadable(*conns[i]);
      }
      if (fds[0].revents & POLLIN) {
        for (;;) {
          Socket s = listener_.accept(Clock::now());
          if (!s.valid()) break;
          loop.accept(std::move(s));
        }
      }
    }
    loop.expireSilent();
    loop.decideTimeout();
    loop.sweep();
  }
  // A failure reported just before stop() (rank 0's own init failing) still reaches the others.
  for (auto& c : loop.connections()) {
    if (!c->dead) loop.onReadable(*c);
  }
  loop.decideTimeout(true);
  loop.shutdown();
}

}  // namespace cyxwiz::comm
