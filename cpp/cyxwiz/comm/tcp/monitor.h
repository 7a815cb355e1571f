// Monitor: this rank's line to the job monitor on rank 0 (store_server.h).
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
#include "cyxwiz/comm/tcp/socket.h"
#include "cyxwiz/comm/tcp/wire.h"

namespace cyxwiz::comm::tcp {

struct Failure {
  wire::ErrorKind kind = wire::ErrorKind::Network;
  int origin = -1;       // the rank the failure happened on
  std::string message;   // as that rank raised it
};

// "stopped because rank 1 failed: <its message>" (or just the message when rank 0 was lost).
std::string noticeText(const Failure& failure);

// Throws the exception class that matches `kind` (NetworkError, TimeoutError, BackendError).
[[noreturn]] void raiseFailure(wire::ErrorKind kind, const std::string& message);

class Monitor {
 public:
  Monitor(const DistributedConfig& config, Deadline deadline);

  // -1 once the job ended on purpose (rank 0 finalized): nothing more to watch.
  int fd() const { return shutdown_ ? -1 : socket_.fd(); }
  // Call when fd() is readable: the failure another rank reported (or rank 0's loss), if any.
  std::optional<Failure> read();
  // Waits until the deadline for a failure notice (nothing when the deadline passes quietly).
  std::optional<Failure> waitForNotice(Deadline deadline);
  // Best effort: tells rank 0 why this rank stops, so that the other ranks stop too.
  void report(wire::ErrorKind kind, const std::string& message);
  // This rank finalizes on purpose; its disconnect is not a failure.
  void goodbye();

 private:
  // What a peer that sends a notice rank 0 never sends gets: the line is closed, the job stopped.
  Failure notMaster(const std::string& what);

  Socket socket_;
  std::vector<uint8_t> in_;
  bool shutdown_ = false;
  std::string master_;
};

}  // namespace cyxwiz::comm::tcp
