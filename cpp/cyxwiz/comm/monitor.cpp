#include "cyxwiz/comm/monitor.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/comm/tcp_store.h"

namespace cyxwiz::comm {

void raiseFailure(wire::ErrorKind kind, const std::string& message) {
  switch (kind) {
    case wire::ErrorKind::Timeout: throw TimeoutError(message);
    case wire::ErrorKind::Backend: throw BackendError(message);
    case wire::ErrorKind::Network: break;
  }
  throw NetworkError(message);
}

Monitor::Monitor(const DistributedConfig& config, Deadline deadline)
    : socket_(dialRendezvous(config, wire::Channel::Monitor, deadline)),
      master_(makeString(config.masterAddr, ":", config.masterPort)) {}

std::optional<Failure> Monitor::read() {
  if (shutdown_) return std::nullopt;
  uint8_t buf[4096];
  for (;;) {
    IoStatus st = socket_.recvSome(buf, sizeof buf);
    if (!st.ok()) {
      shutdown_ = true;
      return Failure{wire::ErrorKind::Network, 0,
                     makeString("lost the connection to rank 0 (", master_, "), which serves the rendezvous: ",
                                st.describe(), "; rank 0 died or was killed")};
    }
    if (st.done == 0) break;
    in_.insert(in_.end(), buf, buf + st.done);
  }
  if (in_.size() < wire::kFrameBytes) return std::nullopt;
  wire::Frame f = wire::decodeFrame(in_.data());
  if (in_.size() < wire::kFrameBytes + f.length) return std::nullopt;
  std::string message(reinterpret_cast<const char*>(in_.data()) + wire::kFrameBytes, f.length);
  in_.erase(in_.begin(), in_.begin() + static_cast<long>(wire::kFrameBytes + f.length));
  if (f.type == static_cast<uint8_t>(wire::Notice::Shutdown)) {
    shutdown_ = true;
    return std::nullopt;
  }
  return Failure{static_cast<wire::ErrorKind>(f.kind), static_cast<int>(f.word), message};
}

void Monitor::report(wire::ErrorKind kind, const std::string& message) {
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

}  // namespace cyxwiz::comm
