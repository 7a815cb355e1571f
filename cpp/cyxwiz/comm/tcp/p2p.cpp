#include "cyxwiz/comm/tcp/p2p.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::tcp {

struct PointToPoint::Op {
  std::shared_ptr<Work> work;
  Tensor tensor;  // holds the caller's buffer; dropped before the work finishes
  uint8_t* data = nullptr;
  size_t bytes = 0;
  int peer = -1;  // -1: a recv from any rank
  int64_t tag = 0;
  Deadline deadline{};
  size_t sent = 0;  // a send's bytes written, header included
  uint8_t header[wire::kPeerHeaderBytes] = {};
};

struct PointToPoint::Message {
  int src = -1;
  wire::PeerHeader header;
  uint64_t have = 0;
  std::shared_ptr<Op> recv;   // the recv it goes to; null while unexpected
  std::vector<uint8_t> own;   // where it lands while no recv (of its size) has it
  bool discard = false;       // its recv failed: read it to keep the link in step, then drop it
  bool complete() const { return have == header.bytes; }
  uint8_t* dest() { return recv && !discard && own.empty() ? recv->data : own.data(); }
};

struct PointToPoint::Inbound {
  Socket socket;
  int rank = -1;
  std::string address;
  uint8_t header[wire::kPeerHeaderBytes] = {};
  size_t headerHave = 0;
  std::shared_ptr<Message> current;
  std::vector<uint8_t> early;  // bytes that came with the handshake
};

struct PointToPoint::Outbound {
  enum State { Idle, Dialing, Ready, Failed } state = Idle;
  Socket socket;
  std::unique_ptr<CallerHello> hello;
  std::vector<uint8_t> in;
  std::deque<std::shared_ptr<Op>> queue;
  std::exception_ptr failed;
};

namespace {

std::exception_ptr networkError(const std::string& message) { return std::make_exception_ptr(NetworkError(message)); }

uint64_t callOf(int64_t tag) { return static_cast<uint64_t>(-tag) >> 4; }
Collective kindOf(int64_t tag) { return static_cast<Collective>(static_cast<uint64_t>(-tag) & 15); }
// Both tags are collectives' at the same position in the call order, but not the same collective.
bool otherCollective(int64_t a, int64_t b) { return a < 0 && b < 0 && a != b && callOf(a) == callOf(b); }

}  // namespace

int64_t collectiveTag(const CallSignature& call) {
  return -static_cast<int64_t>((call.sequence << 4) | static_cast<uint64_t>(call.collective));
}

PointToPoint::PointToPoint(const DistributedConfig& config, std::unique_ptr<HelloGate> gate,
                           std::vector<std::string> addresses)
    : config_(config), gate_(std::move(gate)), addresses_(std::move(addresses)) {
  gate_->setWhere("ring port");
  for (int r = 0; r < config_.worldSize; ++r) out_.push_back(std::make_unique<Outbound>());
  closedFrom_.resize(static_cast<size_t>(config_.worldSize));
  thread_ = std::thread([this] { loop(); });
}

PointToPoint::~PointToPoint() { shutdown(Clock::now()); }

std::string PointToPoint::peerName(int rank) const {
  return makeString("rank ", rank, " (", addresses_.at(static_cast<size_t>(rank)), ")");
}

void PointToPoint::wake() {
  wake_.signal();
}

std::shared_ptr<PointToPoint::Op> PointToPoint::makeOp(const CallSignature& call, const Tensor& data, int peer,
                                                       int64_t tag) {
  auto op = std::make_shared<Op>();
  op->work = std::make_shared<Work>(call, config_.rank, config_.worldSize);
  op->tensor = data;
  op->data = static_cast<uint8_t*>(data.rawData());
  op->bytes = data.nbytes();
  op->peer = peer;
  op->tag = tag;
  op->deadline = deadlineAfterMs(config_.timeoutMs);
  return op;
}

std::shared_ptr<Work> PointToPoint::send(const Tensor& data, int dst, int64_t tag, const CallSignature& call) {
  auto op = makeOp(call, data, dst, tag);
  wire::encodePeer({tag, op->bytes}, op->header);
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw DistError(makeString(op->work->description(), ": the process group was finalized"));
    Outbound& o = *out_[static_cast<size_t>(dst)];
    if (o.state == Outbound::Failed) {
      done.emplace_back(op, o.failed);
    } else {
      o.queue.push_back(op);
      // The head's clock starts when it can move: a send behind others waits for them first.
      if (o.queue.size() > 1) op->deadline = Deadline::max();
    }
  }
  finishAll(done);
  wake();
  return op->work;
}

std::shared_ptr<Work> PointToPoint::recv(const Tensor& data, int src, int64_t tag, const CallSignature& call) {
  auto op = makeOp(call, data, src, tag);
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw DistError(makeString(op->work->description(), ": the process group was finalized"));
    auto match = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const std::shared_ptr<Message>& m) {
      return (src < 0 || m->src == src) && m->header.tag == tag;
    });
    if (match != unexpected_.end()) {
      std::shared_ptr<Message> m = *match;
      unexpected_.erase(match);
      m->recv = op;
      if (m->complete()) deliver(*m);  // else the reader delivers it when its last byte is in
    } else if (auto other = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const std::shared_ptr<Message>& m) {
                 return (src < 0 || m->src == src) && otherCollective(m->header.tag, tag);
               });
               other != unexpected_.end()) {
      mismatch(op, (*other)->src, (*other)->header.tag);
    } else if (src >= 0 && !closedFrom_[static_cast<size_t>(src)].empty()) {
      done.emplace_back(op, networkError(makeString(op->work->description(), ": ", closedFrom_[static_cast<size_t>(src)])));
    } else {
      posted_.push_back(op);
    }
    done.insert(done.end(), finished_.begin(), finished_.end());
    finished_.clear();
  }
  finishAll(done);
  wake();
  return op->work;
}

// A message and its recv meet: the bytes are in the recv's buffer (or in the message's own, to copy).
void PointToPoint::deliver(Message& m) {
  std::shared_ptr<Op> op = std::move(m.recv);
  if (!op) return;
  if (m.header.bytes != op->bytes) {
    const bool user = m.header.tag >= 0;
    finished_.emplace_back(op, std::make_exception_ptr(BackendError(makeString(
        op->work->description(), ": ", peerName(m.src), " sent ", m.header.bytes, " bytes",
        user ? makeString(" with tag ", m.header.tag) : std::string(), ", but this rank expects ", op->bytes,
        user ? ": send and receive tensors of the same size and dtype"
             : ": every rank must pass the same element counts (split sizes) and dtype"))));
    return;
  }
  if (!m.own.empty()) std::memcpy(op->data, m.own.data(), op->bytes);
  op->work->setSourceRank(m.src);
  finished_.emplace_back(op, nullptr);
}

void PointToPoint::mismatch(const std::shared_ptr<Op>& op, int src, int64_t tag) {
  finished_.emplace_back(op, std::make_exception_ptr(BackendError(makeString(
      op->work->description(), ": mismatch with ", peerName(src), ", which called ", collectiveName(kindOf(tag)), " #",
      callOf(tag), ": every rank must call the same collectives in the same order"))));
}

void PointToPoint::finishAll(std::vector<Finished>& done) {
  // Outside the lock: dropping a tensor may release a Python array (bindings/gil.h).
  for (auto& [op, error] : done) {
    op->tensor = Tensor();
    op->work->finish(error);
  }
  done.clear();
}

void PointToPoint::admit(HelloGate::Arrival arrival) {
  const int from = static_cast<int>(arrival.hello.rank);
  auto in = std::make_unique<Inbound>();
  in->socket = std::move(arrival.socket);
  in->socket.setNonBlocking();
  in->socket.setNoDelay();
  in->socket.setLiveness(config_.timeoutMs);
  in->rank = from;
  in->address = arrival.address;
  in->early = std::move(arrival.rest);
  closedFrom_[static_cast<size_t>(from)].clear();
  in_.push_back(std::move(in));
  Inbound& added = *in_.back();
  if (!added.early.empty()) readFrom(added);
}

void PointToPoint::dial(int dst) {
  Outbound& o = *out_[static_cast<size_t>(dst)];
  const std::string& address = addresses_[static_cast<size_t>(dst)];
  std::string host = address.substr(0, address.rfind(':'));
  int port = std::stoi(address.substr(address.rfind(':') + 1));
  int err = 0;
  // On one machine or a LAN the kernel completes the connection at once; the peer's thread need not run.
  Socket s = Socket::connectTo(host, port, std::min(o.queue.front()->deadline, deadlineAfterMs(config_.timeoutMs)), &err);
  if (!s.valid()) {
    return failOutbound(dst, networkError(makeString(rankPrefix(), "send: cannot connect to ", peerName(dst), ": ",
                                                     errnoString(err), " (it finalized, or it is gone)")));
  }
  s.setNoDelay();
  s.setLiveness(config_.timeoutMs);
  wire::Hello hello;
  hello.channel = wire::Channel::Ring;
  hello.jobHash = wire::hashJobId(config_.jobId);
  hello.worldSize = static_cast<uint32_t>(config_.worldSize);
  hello.rank = static_cast<uint32_t>(config_.rank);
  hello.generation = config_.generation;
  o.hello = std::make_unique<CallerHello>(hello, config_.secret, dst);
  const std::vector<uint8_t>& opening = o.hello->opening();
  IoStatus st = s.sendAll(opening.data(), opening.size(), deadlineAfterMs(config_.timeoutMs));
  if (!st.ok()) {
    return failOutbound(dst, networkError(makeString(rankPrefix(), "send: ", peerName(dst), " closed the link during its hello: ",
                                                     st.describe())));
  }
  o.socket = std::move(s);
  o.state = Outbound::Dialing;
}

void PointToPoint::advanceDial(int dst) {
  Outbound& o = *out_[static_cast<size_t>(dst)];
  size_t have = o.in.size();
  o.in.resize(o.hello->need());
  IoStatus st = o.socket.recvSome(o.in.data() + have, o.in.size() - have);
  o.in.resize(have + st.done);
  if (!st.ok()) {
    return failOutbound(dst, networkError(makeString(rankPrefix(), "send: ", peerName(dst), " closed the link during its hello: ",
                                                     st.describe())));
  }
  if (o.in.size() < o.hello->need()) return;
  std::vector<uint8_t> reply = o.hello->feed(o.in.data());
  o.in.clear();
  if (!reply.empty() && !(st = o.socket.sendAll(reply.data(), reply.size(), deadlineAfterMs(config_.timeoutMs))).ok()) {
    return failOutbound(dst, networkError(makeString(rankPrefix(), "send: ", peerName(dst), " left during the hello: ",
                                                     st.describe())));
  }
  if (!o.hello->done()) return;
  if (o.hello->answer().kind != HelloAnswer::Welcome) {
    return failOutbound(dst, networkError(makeString(rankPrefix(), "send: ", peerName(dst), " refused this rank's link: ",
                                                     o.hello->answer().reason)));
  }
  o.hello.reset();
  o.state = Outbound::Ready;
}

void PointToPoint::writeTo(int dst) {
  Outbound& o = *out_[static_cast<size_t>(dst)];
  while (!o.queue.empty()) {
    Op& op = *o.queue.front();
    const size_t total = wire::kPeerHeaderBytes + op.bytes;
    while (op.sent < total) {
      IoStatus st = op.sent < wire::kPeerHeaderBytes
                        ? o.socket.sendSome(op.header + op.sent, wire::kPeerHeaderBytes - op.sent)
                        : o.socket.sendSome(op.data + (op.sent - wire::kPeerHeaderBytes), total - op.sent);
      if (!st.ok()) {
        return failOutbound(dst, networkError(makeString(
            op.work->description(), ": ", peerName(dst), " ", st.kind == IoStatus::Closed ? "closed the link" : "failed",
            " after ", op.sent, " of ", total, " bytes (", st.describe(), "): it finalized before receiving, or it died")));
      }
      if (st.done == 0) return;  // the kernel's buffer is full: poll says when it drains
      op.sent += st.done;
      op.deadline = deadlineAfterMs(config_.timeoutMs);
    }
    finished_.emplace_back(o.queue.front(), nullptr);
    o.queue.pop_front();
    if (!o.queue.empty()) o.queue.front()->deadline = deadlineAfterMs(config_.timeoutMs);
  }
}

void PointToPoint::failOutbound(int dst, std::exception_ptr error) {
  Outbound& o = *out_[static_cast<size_t>(dst)];
  for (auto& op : o.queue) finished_.emplace_back(op, error);
  o.queue.clear();
  o.socket.close();
  o.hello.reset();
  o.state = Outbound::Failed;
  o.failed = error;
}

void PointToPoint::readFrom(Inbound& in) {
  for (;;) {
    IoStatus st;
    const bool early = !in.early.empty();
    if (!in.current) {
      size_t want = wire::kPeerHeaderBytes - in.headerHave;
      if (early) {
        st.done = std::min(want, in.early.size());
        std::memcpy(in.header + in.headerHave, in.early.data(), st.done);
      } else {
        st = in.socket.recvSome(in.header + in.headerHave, want);
      }
      in.headerHave += st.done;
      if (st.ok() && in.headerHave == wire::kPeerHeaderBytes) onHeader(in);
    } else {
      Message& m = *in.current;
      size_t want = static_cast<size_t>(m.header.bytes - m.have);
      if (early) {
        st.done = std::min(want, in.early.size());
        std::memcpy(m.dest() + m.have, in.early.data(), st.done);
      } else {
        st = in.socket.recvSome(m.dest() + m.have, want);
      }
      m.have += st.done;
      if (st.done > 0 && m.recv) m.recv->deadline = deadlineAfterMs(config_.timeoutMs);
    }
    if (early) in.early.erase(in.early.begin(), in.early.begin() + static_cast<std::ptrdiff_t>(st.done));
    if (!st.ok()) {
      bool midMessage = in.current || in.headerHave > 0;
      return closeInbound(in, makeString(peerName(in.rank), " closed its link to this rank",
                                         midMessage ? " in the middle of a message" : "",
                                         st.kind == IoStatus::Closed ? "" : " (" + st.describe() + ")",
                                         ": it finalized, or it died"));
    }
    if (in.current && in.current->complete()) {
      std::shared_ptr<Message> m = std::move(in.current);
      if (m->recv) deliver(*m);
      if (m->discard) unexpected_.erase(std::remove(unexpected_.begin(), unexpected_.end(), m), unexpected_.end());
      continue;
    }
    if (st.done == 0 || !in.socket.valid()) return;
  }
}

void PointToPoint::onHeader(Inbound& in) {
  in.headerHave = 0;
  auto m = std::make_shared<Message>();
  m->src = in.rank;
  if (!wire::decodePeer(in.header, &m->header)) {
    return closeInbound(in, makeString(peerName(in.rank), " sent bytes that are not a point-to-point message header "
                                       "(mixed pycyxwiz versions?)"));
  }
  auto match = std::find_if(posted_.begin(), posted_.end(), [&](const std::shared_ptr<Op>& op) {
    return (op->peer < 0 || op->peer == in.rank) && op->tag == m->header.tag;
  });
  if (match != posted_.end()) {
    m->recv = *match;
    posted_.erase(match);
    m->recv->deadline = deadlineAfterMs(config_.timeoutMs);
    // A size that differs lands in a buffer of its own; deliver() then fails the recv.
    if (m->header.bytes != m->recv->bytes) m->own.resize(static_cast<size_t>(m->header.bytes));
  } else {
    m->own.resize(static_cast<size_t>(m->header.bytes));
    unexpected_.push_back(m);
    auto other = std::find_if(posted_.begin(), posted_.end(), [&](const std::shared_ptr<Op>& op) {
      return (op->peer < 0 || op->peer == in.rank) && otherCollective(op->tag, m->header.tag);
    });
    if (other != posted_.end()) {
      mismatch(*other, in.rank, m->header.tag);
      posted_.erase(other);
    }
  }
  in.current = m;
  if (m->complete()) {
    in.current.reset();
    if (m->recv) deliver(*m);
  }
}

void PointToPoint::closeInbound(Inbound& in, const std::string& why) {
  if (in.current) {
    std::shared_ptr<Message> m = std::move(in.current);
    if (m->recv) finished_.emplace_back(m->recv, networkError(makeString(m->recv->work->description(), ": ", why)));
    m->recv.reset();
    unexpected_.erase(std::remove(unexpected_.begin(), unexpected_.end(), m), unexpected_.end());
  }
  in.socket.close();
  closedFrom_[static_cast<size_t>(in.rank)] = why;
  // Recvs that only this rank could satisfy never will.
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer == in.rank) {
      finished_.emplace_back(*it, networkError(makeString((*it)->work->description(), ": ", why)));
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
}

void PointToPoint::expire() {
  const Deadline now = Clock::now();
  for (auto it = posted_.begin(); it != posted_.end();) {
    Op& op = **it;
    if (op.deadline > now) {
      ++it;
      continue;
    }
    std::string from = op.peer < 0 ? std::string("any rank") : peerName(op.peer);
    std::string remedy = op.tag >= 0 ? makeString("The sender must call send(..., dst=", config_.rank, ", tag=", op.tag, "); ")
                                     : makeString(from, " has not reached this collective (is it stopped, or in another "
                                                  "one? every rank must call the same collectives in the same order); ");
    finished_.emplace_back(*it, std::make_exception_ptr(TimeoutError(makeString(
        op.work->description(), ": no message", op.tag >= 0 ? makeString(" with tag ", op.tag) : std::string(),
        " arrived from ", from, " within ", config_.timeoutMs, " ms. ", remedy,
        "if it is only slow, raise the timeout (DISTRIBUTED_TIMEOUT_MS, or init_process_group(timeout=...))"))));
    it = posted_.erase(it);
  }
  for (auto& in : in_) {
    if (!in->current || !in->current->recv || in->current->recv->deadline > now) continue;
    Message& m = *in->current;
    finished_.emplace_back(m.recv, std::make_exception_ptr(TimeoutError(makeString(
        m.recv->work->description(), ": ", peerName(in->rank), " stopped sending in the middle of the message (",
        m.have, " of ", m.header.bytes, " bytes) for ", config_.timeoutMs, " ms"))));
    // The rest still arrives on this link: read it aside and drop it.
    if (m.own.empty()) {
      m.own.resize(static_cast<size_t>(m.header.bytes));
      std::memcpy(m.own.data(), m.recv->data, static_cast<size_t>(m.have));
    }
    m.recv.reset();
    m.discard = true;
  }
  for (int dst = 0; dst < config_.worldSize; ++dst) {
    Outbound& o = *out_[static_cast<size_t>(dst)];
    if (o.queue.empty() || o.queue.front()->deadline > now) continue;
    Op& op = *o.queue.front();
    failOutbound(dst, std::make_exception_ptr(TimeoutError(makeString(
        op.work->description(), ": ", peerName(dst), " took none of the message's bytes for ", config_.timeoutMs,
        " ms (", op.sent, " of ", wire::kPeerHeaderBytes + op.bytes, " sent): it is stopped or stuck; if it is only "
        "slow, raise the timeout (DISTRIBUTED_TIMEOUT_MS, or init_process_group(timeout=...))"))));
  }
}

int PointToPoint::pollTimeoutMs() {
  Deadline next = Deadline::max();
  for (auto& op : posted_) next = std::min(next, op->deadline);
  for (auto& in : in_) {
    if (in->current && in->current->recv) next = std::min(next, in->current->recv->deadline);
  }
  for (auto& o : out_) {
    if (!o->queue.empty()) next = std::min(next, o->queue.front()->deadline);
  }
  if (stopping_) next = std::min(next, flushBy_);
  int ms = next == Deadline::max() ? -1 : msUntil(next) + 1;
  int gateMs = gate_->msUntilNextDeadline();
  if (gateMs >= 0) ms = ms < 0 ? gateMs + 1 : std::min(ms, gateMs + 1);
  return ms;
}

void PointToPoint::loop() {
  std::vector<platform::PollFd> fds;
  std::vector<int> outAt;  // fds index of each destination's link, -1 when none is polled
  std::vector<Finished> done;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const bool flushing = std::any_of(out_.begin(), out_.end(), [](auto& o) { return !o->queue.empty(); });
    if (stopping_ && (!flushing || Clock::now() >= flushBy_)) break;
    for (int dst = 0; dst < config_.worldSize; ++dst) {
      Outbound& o = *out_[static_cast<size_t>(dst)];
      if (o.state == Outbound::Idle && !o.queue.empty()) dial(dst);
    }
    fds.clear();
    fds.push_back(platform::pollEntry(wake_.handle(), POLLIN));
    outAt.assign(out_.size(), -1);
    for (size_t dst = 0; dst < out_.size(); ++dst) {
      Outbound& o = *out_[dst];
      if (o.state != Outbound::Dialing && o.state != Outbound::Ready) continue;
      outAt[dst] = static_cast<int>(fds.size());
      short events = POLLIN;  // a hello's answer, or the peer closing
      if (o.state == Outbound::Ready && !o.queue.empty()) events |= POLLOUT;
      fds.push_back(platform::pollEntry(o.socket.fd(), events));
    }
    const size_t inFrom = fds.size();
    for (auto& in : in_) fds.push_back(platform::pollEntry(in->socket.fd(), POLLIN));
    const size_t gateFrom = fds.size();
    gate_->addPollFds(fds);
    int timeout = pollTimeoutMs();
    lock.unlock();
    int err = 0;
    int rc = platform::pollSockets(fds.data(), fds.size(), timeout, &err);
    lock.lock();
    if (rc < 0 && err != EINTR) logWarning(makeString("point-to-point: poll failed: ", errnoString(err)));
    if (fds[0].revents & POLLIN) wake_.drain();
    for (size_t dst = 0; rc > 0 && dst < out_.size(); ++dst) {
      if (outAt[dst] < 0) continue;
      const platform::PollFd& p = fds[static_cast<size_t>(outAt[dst])];
      Outbound& o = *out_[dst];
      if (o.state == Outbound::Dialing && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        advanceDial(static_cast<int>(dst));
      } else if (o.state == Outbound::Ready && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        // A receiver never writes on this link: readable means it closed.
        uint8_t byte;
        IoStatus st = o.socket.recvSome(&byte, 1);
        if (!st.ok() || st.done > 0) {
          failOutbound(static_cast<int>(dst), networkError(makeString(rankPrefix(), "send: ", peerName(static_cast<int>(dst)),
                                                                      " closed its link from this rank: it finalized, or it died")));
        }
      }
    }
    // Writes go to every ready link with queued sends, polled or just connected.
    for (size_t dst = 0; dst < out_.size(); ++dst) {
      if (out_[dst]->state == Outbound::Ready && !out_[dst]->queue.empty()) writeTo(static_cast<int>(dst));
    }
    for (size_t i = 0; rc > 0 && i < gateFrom - inFrom; ++i) {
      if (fds[inFrom + i].revents != 0 && in_[i]->socket.valid()) readFrom(*in_[i]);
    }
    in_.erase(std::remove_if(in_.begin(), in_.end(), [](auto& in) { return !in->socket.valid(); }), in_.end());
    const int self = config_.rank;
    HelloGate::Decide decide = [this, self](const wire::Hello& hello, const std::string&, bool* later) -> std::string {
      *later = false;
      const int from = static_cast<int>(hello.rank);
      if (hello.generation != config_.generation) return "it belongs to another init() of this job";
      if (from == self) return "it claims to be this rank";
      for (auto& in : in_) {
        if (in->rank == from && in->socket.valid()) return makeString("rank ", from, " already has a link to this rank");
      }
      return "";
    };
    for (auto& arrival : gate_->handle(fds.data() + gateFrom, decide)) admit(std::move(arrival));
    expire();
    done.swap(finished_);
    lock.unlock();
    finishAll(done);
    lock.lock();
  }
  // Stopped: whatever is still pending ends here.
  auto finalized = [this](const std::shared_ptr<Op>& op) {
    return std::make_exception_ptr(DistError(makeString(op->work->description(), ": the process group was finalized "
                                                        "before it completed")));
  };
  for (auto& o : out_) {
    for (auto& op : o->queue) finished_.emplace_back(op, finalized(op));
    o->queue.clear();
    o->socket.close();
  }
  for (auto& op : posted_) finished_.emplace_back(op, finalized(op));
  posted_.clear();
  for (auto& in : in_) {
    if (in->current && in->current->recv) finished_.emplace_back(in->current->recv, finalized(in->current->recv));
    in->socket.close();
  }
  for (auto& m : unexpected_) {
    if (m->recv) finished_.emplace_back(m->recv, finalized(m->recv));
  }
  in_.clear();
  unexpected_.clear();
  gate_->close();
  stopped_ = true;
  done.swap(finished_);
  lock.unlock();
  finishAll(done);
}

void PointToPoint::shutdown(Deadline flushBy) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      flushBy_ = flushBy;
    }
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cyxwiz::comm::tcp
