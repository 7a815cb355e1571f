// Monitor: this rank's line to the job monitor, which hears every rank's failure. A rank that fails
// reports why; every other rank learns it here and stops at once with the original cause. The
// transports' waits poll fd() beside their own sockets (tcp/duplex.h) or between futex sleeps
// (shm/window.h). The TCP one (tcp/monitor.h) is a connection to rank 0's store server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/platform/net.h"

namespace cyxwiz::comm {

// Why a rank stopped: the exception class every rank raises for it (one byte in a notice).
enum class ErrorKind : uint8_t { Network = 1, Timeout = 2, Backend = 3 };

struct Failure {
  ErrorKind kind = ErrorKind::Network;
  int origin = -1;       // the rank the failure happened on
  std::string message;   // as that rank raised it
};

// "stopped because rank 1 failed: <its message>" (or just the message when rank 0 was lost).
std::string noticeText(const Failure& failure);

// Throws the exception class that matches `kind` (NetworkError, TimeoutError, BackendError).
[[noreturn]] void raiseFailure(ErrorKind kind, const std::string& message);

class Monitor {
 public:
  virtual ~Monitor() = default;
  // The socket to poll; kNoSocket once the job ended on purpose (rank 0 finalized): nothing to watch.
  virtual platform::SocketHandle fd() const = 0;
  // Call when fd() is readable: the failure another rank reported (or rank 0's loss), if any.
  virtual std::optional<Failure> read() = 0;
  // Best effort: tells the job why this rank stops, so that the other ranks stop too.
  virtual void report(ErrorKind kind, const std::string& message) = 0;
  // This rank finalizes on purpose; its disconnect is not a failure.
  virtual void goodbye() = 0;

  // Waits until the deadline for a failure notice (nothing when the deadline passes quietly).
  std::optional<Failure> waitForNotice(Deadline deadline);
};

}  // namespace cyxwiz::comm
