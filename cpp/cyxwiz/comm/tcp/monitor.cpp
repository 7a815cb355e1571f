#include "cyxwiz/comm/tcp/monitor.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/comm/tcp/tcp_store.h"

namespace cyxwiz::comm::tcp {

Monitor::Monitor(const DistributedConfig& config, Deadline deadline)
    : socket_(dialRendezvous(config, wire::Channel::Monitor, deadline)),
      master_(makeString(config.masterAddr, ":", config.masterPort)) {}

std::optional<Failure> Monitor::read() {
  if (shutdown_) return std::nullopt;
  uint8_t buf[4096];
  bool closed = false;
  int err = 0;
  // Reads no more than the largest notice can need: the rest waits in the kernel.
  while (in_.size() < wire::kFrameBytes + wire::kMaxNoticeBytes) {
    IoStatus st = socket_.recvSome(buf, sizeof buf);
    if (!st.ok()) {
      closed = true;
      err = st.err;
      break;
    }
    if (st.done == 0) break;
    in_.insert(in_.end(), buf, buf + st.done);
  }
  // A notice that arrived just before the close explains it: read it first.
  if (in_.size() >= wire::kFrameBytes) {
    wire::Frame f = wire::decodeFrame(in_.data());
    bool known = f.type == static_cast<uint8_t>(wire::Notice::Abort) || f.type == static_cast<uint8_t>(wire::Notice::Shutdown);
    if (!known || f.length > wire::kMaxNoticeBytes) {
      return notMaster(!known ? makeString("a notice of unknown type ", static_cast<int>(f.type))
                              : makeString("a notice of ", f.length, " bytes (a notice holds at most ",
                                           wire::kMaxNoticeBytes, ")"));
    }
    if (in_.size() - wire::kFrameBytes >= f.length) {
      std::string message(reinterpret_cast<const char*>(in_.data()) + wire::kFrameBytes, f.length);
      in_.erase(in_.begin(), in_.begin() + static_cast<long>(wire::kFrameBytes + f.length));
      if (f.type == static_cast<uint8_t>(wire::Notice::Abort)) {
        return Failure{static_cast<ErrorKind>(f.kind), static_cast<int>(f.word), message};
      }
      shutdown_ = true;  // rank 0 finalized: the job ended on purpose
      return std::nullopt;
    }
  }
  if (closed) {
    shutdown_ = true;
    if (isUnreachableError(err)) {
      return Failure{ErrorKind::Network, 0,
                     makeString("lost the connection to rank 0 (", master_, "), which serves the rendezvous: rank 0 at ",
                                master_, " unreachable: ", errnoString(err), " (a cut cable, a machine that is down "
                                "or a firewall that drops the traffic)")};
    }
    return Failure{ErrorKind::Network, 0,
                   makeString("lost the connection to rank 0 (", master_, "), which serves the rendezvous: ",
                              "connection closed; rank 0 died or was killed")};
  }
  return std::nullopt;
}

Failure Monitor::notMaster(const std::string& what) {
  std::string peer = socket_.peerAddress();
  shutdown_ = true;
  socket_.close();  // the rest of its stream means nothing
  in_.clear();
  return Failure{ErrorKind::Network, 0,
                 makeString("lost the connection to rank 0 (", master_, "), which serves the rendezvous: it sent ", what,
                            ": the peer at ", peer == "?" ? master_ : peer, " is not a pycyxwiz master of this job "
                            "(another program on that port?); check MASTER_ADDR and MASTER_PORT")};
}

void Monitor::report(ErrorKind kind, const std::string& message) {
  if (shutdown_ || !socket_.valid()) return;
  std::string text = message.substr(0, 1 << 16);
  std::vector<uint8_t> out(wire::kFrameBytes + text.size());
  wire::encodeFrame({static_cast<uint8_t>(wire::StoreOp::Abort), static_cast<uint8_t>(kind), 0, text.size()}, out.data());
  std::memcpy(out.data() + wire::kFrameBytes, text.data(), text.size());
  socket_.sendAll(out.data(), out.size(), deadlineAfterMs(100));
}

void Monitor::goodbye() {
  if (shutdown_ || !socket_.valid()) return;
  uint8_t out[wire::kFrameBytes];
  wire::encodeFrame({static_cast<uint8_t>(wire::StoreOp::Goodbye), 0, 0, 0}, out);
  socket_.sendAll(out, sizeof out, deadlineAfterMs(100));
  socket_.close();
}

}  // namespace cyxwiz::comm::tcp
