#include "cyxwiz/comm/tcp/store_server.h"

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cyxwiz/comm/monitor.h"
#include "cyxwiz/comm/tcp/tcp_store.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::tcp {

namespace {

constexpr size_t kMaxKeyBytes = 4096;
constexpr std::chrono::milliseconds kTimeoutVerdictWindow{1000};
// The quota. A job stores a few dozen bytes per rank; these bounds only stop a stranger (or a bug)
// from filling rank 0's memory.
constexpr uint64_t kMaxValueBytes = wire::kMaxStoreValueBytes;
constexpr uint64_t kMaxStoredBytes = 64ull << 20;
constexpr size_t kMaxKeys = 65536;
constexpr size_t kMaxWaitingGets = 64;  // per connection; a rank has one request out at a time
constexpr uint64_t kMaxUnsentBytes = 2 * kMaxValueBytes;  // answers a connection leaves unread
// A rank sends its hello as soon as it connects: a connection silent for this long is a stranger.
constexpr int64_t kHelloTimeoutMs = 3000;
// Consumed bytes at the front of a buffer are dropped once they are this many and half of it.
constexpr size_t kCompactBytes = 64 << 10;

void compact(std::vector<uint8_t>& buf, size_t& pos) {
  if (pos == buf.size()) {
    buf.clear();
    pos = 0;
  } else if (pos >= kCompactBytes && pos * 2 >= buf.size()) {
    buf.erase(buf.begin(), buf.begin() + static_cast<long>(pos));
    pos = 0;
  }
}

int64_t toInteger(const std::string& s) {
  try {
    return s.empty() ? 0 : std::stoll(s);
  } catch (const std::exception&) {
    return 0;  // add() on a key that holds text starts from 0, as a counter would
  }
}

struct Connection {
  enum State { Store, Monitor } state = Store;
  Socket socket;
  std::string address;
  int rank = -1;
  // Reading and writing move an offset; the consumed front is dropped now and then (compact), so
  // that many pipelined requests cost linear time.
  std::vector<uint8_t> in;
  size_t inPos = 0;
  std::vector<uint8_t> out;
  size_t outPos = 0;
  size_t waitingGets = 0;
  uint64_t skip = 0;  // bytes of a refused request still to drop
  bool saidGoodbye = false;
  bool dead = false;
};

// The loop's state; lives on the server thread only.
class Loop {
 public:
  explicit Loop(const JobIdentity& job) : job_(job) {}

  // Who may join, once the gate has checked the hello and the secret.
  std::string admission(const wire::Hello& hello, bool* later) {
    bool monitor = hello.channel == wire::Channel::Monitor;
    for (auto& other : conns_) {
      if (!other->dead && other->rank == static_cast<int>(hello.rank) && (other->state == Connection::Monitor) == monitor) {
        return makeString("rank ", hello.rank, " has already joined from ", other->address,
                          ": two processes were given the same rank");
      }
    }
    std::string refusal = checkGeneration(hello, job_);
    *later = !refusal.empty();
    return refusal;
  }

  void admit(HelloGate::Arrival a) {
    auto c = std::make_unique<Connection>();
    c->state = a.hello.channel == wire::Channel::Monitor ? Connection::Monitor : Connection::Store;
    c->rank = static_cast<int>(a.hello.rank);
    c->address = a.address;
    c->socket = std::move(a.socket);
    c->in = std::move(a.rest);
    conns_.push_back(std::move(c));
    Connection& added = *conns_.back();
    if (added.state == Connection::Monitor && aborted_) {
      // Joined after the job already failed: it must not start working.
      send(added, frame(static_cast<uint8_t>(wire::Notice::Abort), static_cast<uint8_t>(ErrorKind::Network), 0,
                        "the job failed before this rank joined"));
    }
    while (!added.dead && parseOne(added)) {
    }
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
    while (!c.dead && parseOne(c)) {
    }
    compact(c.in, c.inPos);
    if (closed) lost(c);
  }

  void onWritable(Connection& c) {
    while (c.outPos < c.out.size()) {
      IoStatus st = c.socket.sendAll(c.out.data() + c.outPos, c.out.size() - c.outPos, Clock::now());
      c.outPos += st.done;
      if (st.kind == IoStatus::TimedOut) break;  // kernel buffer full: poll for POLLOUT again
      if (!st.ok()) return lost(c);
    }
    compact(c.out, c.outPos);
  }

  bool wantsToWrite(const Connection& c) const { return c.outPos < c.out.size(); }

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
    if (c.dead) return;
    if (c.out.size() - c.outPos > kMaxUnsentBytes) {
      // A rank reads each answer before it asks again; this one sends requests and reads nothing.
      logWarning(makeString("rendezvous: closed the connection of rank ", c.rank, " (", c.address, "): it left ",
                            (c.out.size() - c.outPos) >> 20, " MiB of answers unread"));
      return lost(c);
    }
    bool idle = !wantsToWrite(c);  // else the peer is slow to read: POLLOUT resumes, no syscall per answer
    c.out.insert(c.out.end(), bytes.begin(), bytes.end());
    if (idle) onWritable(c);
  }

  void reply(Connection& c, const std::string& value) { send(c, frame(0, 0, 0, value)); }
  // A request refused: the rank raises DistStoreError with `why`.
  void replyError(Connection& c, const std::string& why) {
    logWarning(makeString("rendezvous: refused a request of rank ", c.rank, " (", c.address, "): ", why));
    send(c, frame(1, 0, 0, why.substr(0, wire::kMaxReasonBytes)));  // the rank reads at most this
  }

  // A connection ended. A monitor that never said goodbye means its rank died: tell the others.
  void lost(Connection& c) {
    if (c.dead) return;
    c.dead = true;
    // A rank that reported its failure and then left is not news; one that just vanished is.
    if (c.state == Connection::Monitor && !c.saidGoodbye && !reported_.count(c.rank)) {
      abortJob(c.rank, ErrorKind::Network,
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
  void abortJob(int origin, ErrorKind kind, const std::string& message, bool toOrigin = false) {
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
    abortJob(timeout_.origin, ErrorKind::Timeout, verdict, true);
  }

 private:
  bool parseOne(Connection& c) {
    if (c.skip > 0) {  // the rest of a refused value: read and dropped, never stored
      size_t n = std::min<uint64_t>(c.skip, c.in.size() - c.inPos);
      c.inPos += n;
      c.skip -= n;
      if (c.skip > 0) return false;
    }
    const uint8_t* at = c.in.data() + c.inPos;
    size_t have = c.in.size() - c.inPos;
    if (have < wire::kFrameBytes) return false;
    wire::Frame f = wire::decodeFrame(at);
    if (f.word > kMaxKeyBytes) {
      logWarning(makeString("rendezvous: rank ", c.rank, " (", c.address, ") sent a malformed request (a key of ", f.word,
                            " bytes, at most ", kMaxKeyBytes, "); closing it"));
      lost(c);
      return false;
    }
    if (f.length > kMaxValueBytes) {
      c.inPos += wire::kFrameBytes;
      c.skip = f.word + f.length;
      replyError(c, quotaError(makeString("a value of ", f.length, " bytes is over the quota of ", kMaxValueBytes >> 20,
                                          " MiB per value")));
      return true;
    }
    size_t total = wire::kFrameBytes + f.word + f.length;
    if (have < total) return false;
    std::string key(reinterpret_cast<const char*>(at) + wire::kFrameBytes, f.word);
    std::string value(reinterpret_cast<const char*>(at) + wire::kFrameBytes + f.word, f.length);
    c.inPos += total;
    handle(c, static_cast<wire::StoreOp>(f.type), f.kind, key, value);
    return true;
  }

  static std::string quotaError(const std::string& what) {
    return makeString(what, ": rank 0's rendezvous store holds only the job's addresses (its quota: ", kMaxValueBytes >> 20,
                      " MiB per value, ", kMaxStoredBytes >> 20, " MiB and ", kMaxKeys, " keys in all); the caller is "
                      "not a rank of this job, or runs another pycyxwiz version: start the job with a random "
                      "CYXWIZ_SECRET (the launcher and spawn make one) so that strangers cannot join");
  }

  // "" when storing value under key stays within the quota, else why not.
  std::string overQuota(const std::string& key, size_t valueBytes) const {
    auto it = data_.find(key);
    size_t before = it == data_.end() ? 0 : key.size() + it->second.size();
    if (valueBytes > kMaxValueBytes) {
      return quotaError(makeString("a value of ", valueBytes, " bytes is over the quota of ", kMaxValueBytes >> 20, " MiB per value"));
    }
    if (it == data_.end() && data_.size() >= kMaxKeys) return quotaError(makeString("a new key would exceed ", kMaxKeys, " keys"));
    if (storedBytes_ - before + key.size() + valueBytes > kMaxStoredBytes) {
      return quotaError(makeString("storing ", valueBytes, " bytes under '", key.substr(0, 64), "' would exceed ",
                                   kMaxStoredBytes >> 20, " MiB in all"));
    }
    return "";
  }

  void store(const std::string& key, const std::string& value) {
    auto it = data_.find(key);
    if (it != data_.end()) storedBytes_ -= key.size() + it->second.size();
    data_[key] = value;
    storedBytes_ += key.size() + value.size();
  }

  void handle(Connection& c, wire::StoreOp op, uint8_t kind, const std::string& key, const std::string& value) {
    switch (op) {
      case wire::StoreOp::Set: {
        std::string over = overQuota(key, value.size());
        if (!over.empty()) return replyError(c, over);
        store(key, value);
        reply(c, "");
        auto it = waiters_.find(key);
        if (it != waiters_.end()) {
          for (Connection* w : it->second) {
            if (w != nullptr && !w->dead) {
              --w->waitingGets;
              reply(*w, value);
            }
          }
          waiters_.erase(it);
        }
        return;
      }
      case wire::StoreOp::Get: {
        auto it = data_.find(key);
        if (it != data_.end()) return reply(c, it->second);
        if (c.waitingGets >= kMaxWaitingGets) return replyError(c, makeString("more than ", kMaxWaitingGets, " gets wait at once"));
        ++c.waitingGets;
        waiters_[key].push_back(&c);
        return;
      }
      case wire::StoreOp::Check: return reply(c, data_.count(key) ? "1" : "0");
      case wire::StoreOp::Add: {
        auto it = data_.find(key);
        std::string now = std::to_string((it == data_.end() ? 0 : toInteger(it->second)) + toInteger(value));
        std::string over = overQuota(key, now.size());
        if (!over.empty()) return replyError(c, over);
        store(key, now);
        return reply(c, now);
      }
      case wire::StoreOp::Abort:
        reported_.insert(c.rank);
        if (static_cast<ErrorKind>(kind) == ErrorKind::Timeout) return reportTimeout(c.rank, value);
        return abortJob(c.rank, static_cast<ErrorKind>(kind), value);
      case wire::StoreOp::Goodbye: c.saidGoodbye = true; return;
    }
    logWarning(makeString("rendezvous: rank ", c.rank, " (", c.address, ") sent an unknown request; closing it"));
    lost(c);
  }

  JobIdentity job_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::map<std::string, std::string> data_;
  size_t storedBytes_ = 0;  // keys and values of data_
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

namespace {

// Once per process: an open job on a real network is worth one line, not one per init().
void warnIfOpen(const DistributedConfig& config, const std::string& bound, int port) {
  static std::atomic<bool> warned{false};
  if (config.worldSize < 2 || !config.secret.empty() || isLoopbackAddress(bound) || warned.exchange(true)) return;
  logWarning(makeString("init: this job of ", config.worldSize, " ranks has no shared secret and serves its rendezvous on ",
                        config.masterAddr, ":", port, ", which other machines may reach: any process that reaches it "
                        "can take the seat of a rank that has not joined yet. Set the same random CYXWIZ_SECRET on every "
                        "rank (python -m pycyxwiz.launch and cx.distributed.spawn make one), or keep the ports behind a "
                        "firewall"));
}

}  // namespace

StoreServer::StoreServer(const DistributedConfig& config) : port_(config.masterPort), job_(jobIdentityOf(config)) {
  const int port = config.masterPort, span = config.portSpan;
  // A loopback job listens on loopback only; else the interface that MASTER_ADDR names, or every
  // interface when that address is not this machine's own (behind NAT, a load balancer).
  std::string ip = listenAddressFor(config.masterAddr);
  int err = 0;
  Socket listener;
  for (int p = port; p < port + span && !listener.valid(); ++p) {
    listener = Socket::listenOn(ip, p, 1024, &err);
    if (!listener.valid() && err == EADDRNOTAVAIL && !ip.empty()) {
      logInfo(makeString("init: MASTER_ADDR '", config.masterAddr, "' (", ip, ") is not an address of this machine; "
                         "rank 0 serves the rendezvous on every interface"));
      ip.clear();
      listener = Socket::listenOn(ip, p, 1024, &err);
    }
  }
  if (!listener.valid()) {
    std::string why = err == EADDRINUSE
                          ? "another job, or a process left over from an earlier run, is using it: stop it, or choose "
                            "a free port with MASTER_PORT (the same on every rank); the launcher picks a free port by "
                            "itself when MASTER_PORT is not set"
                          : "check MASTER_PORT (ports below 1024 need privileges)";
    std::string ports = span > 1 ? makeString("ports ", port, "-", port + span - 1) : makeString("port ", port);
    throw NetworkError(makeString(rankPrefix(), "init: rank 0 cannot serve the rendezvous on ", ports, ": ",
                                  errnoString(err), "; ", why));
  }
  port_ = listener.localPort();
  warnIfOpen(config, ip, port_);
  gate_ = std::make_unique<HelloGate>(std::move(listener), job_, false, std::min<int64_t>(config.timeoutMs, kHelloTimeoutMs),
                                      "rendezvous");
  wake_ = std::make_unique<platform::Wakeup>(rankPrefix() + "init: rendezvous server: ");
  thread_ = std::thread([this] { run(); });
}

StoreServer::~StoreServer() {
  stop();
}

void StoreServer::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  wake_->signal();
  thread_.join();
  gate_->close();
}

void StoreServer::run() {
  Loop loop(job_);
  HelloGate::Decide decide = [&loop](const wire::Hello& hello, const std::string&, bool* later) {
    return loop.admission(hello, later);
  };
  std::vector<platform::PollFd> fds;
  while (!stopping_) {
    auto& conns = loop.connections();
    fds.assign({platform::pollEntry(wake_->handle(), POLLIN)});
    gate_->addPollFds(fds);
    size_t first = fds.size();
    for (auto& c : conns) fds.push_back(platform::pollEntry(c->socket.fd(), POLLIN | (loop.wantsToWrite(*c) ? POLLOUT : 0)));
    int timeout = loop.timeoutPending() ? 20 : 200;
    int gateMs = gate_->msUntilNextDeadline();
    if (gateMs >= 0) timeout = std::min(timeout, gateMs + 1);
    int err = 0;
    int rc = platform::pollSockets(fds.data(), fds.size(), timeout, &err);
    if (rc < 0 && err != EINTR) break;
    if (rc > 0) {
      for (size_t i = 0; i < conns.size(); ++i) {
        short ev = fds[first + i].revents;
        if (ev & POLLOUT) loop.onWritable(*conns[i]);
        if (ev & (POLLIN | POLLHUP | POLLERR)) loop.onReadable(*conns[i]);
      }
    }
    // The gate's events, accepts and hello deadlines; admitted ranks join the loop.
    for (auto& arrival : gate_->handle(fds.data() + 1, decide)) loop.admit(std::move(arrival));
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

}  // namespace cyxwiz::comm::tcp
