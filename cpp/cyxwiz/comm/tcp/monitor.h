// Monitor (comm/monitor.h) over TCP: this rank's line to the job monitor on rank 0 (store_server.h).
//
// A rank that fails reports why; rank 0 tells every other rank, whose communication loops poll
// fd() next to their sockets and stop at once with the original cause. A rank that dies says
// nothing, and its closed connection tells rank 0 the same story.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/comm/monitor.h"
#include "cyxwiz/comm/tcp/socket.h"

namespace cyxwiz::comm::tcp {

class Monitor final : public comm::Monitor {
 public:
  Monitor(const DistributedConfig& config, Deadline deadline);

  platform::SocketHandle fd() const override { return shutdown_ ? platform::kNoSocket : socket_.fd(); }
  std::optional<Failure> read() override;
  // Tells rank 0, which tells every other rank.
  void report(ErrorKind kind, const std::string& message) override;
  void goodbye() override;

 private:
  // What a peer that sends a notice rank 0 never sends gets: the line is closed, the job stopped.
  Failure notMaster(const std::string& what);

  Socket socket_;
  std::vector<uint8_t> in_;
  bool shutdown_ = false;
  std::string master_;
};

}  // namespace cyxwiz::comm::tcp
