#include "cyxwiz/comm/monitor.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

void raiseFailure(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::Timeout: throw TimeoutError(message);
    case ErrorKind::Backend: throw BackendError(message);
    case ErrorKind::Network: break;
  }
  throw NetworkError(message);
}

std::string noticeText(const Failure& failure) {
  if (failure.origin == 0 && failure.message.rfind("lost the connection to rank 0", 0) == 0) return failure.message;
  return makeString("stopped because rank ", failure.origin, " failed: ", failure.message);
}

std::optional<Failure> Monitor::waitForNotice(Deadline deadline) {
  while (fd() != platform::kNoSocket) {
    platform::PollFd p = platform::pollEntry(fd(), POLLIN);
    int wait = msUntil(deadline), err = 0;
    if (wait <= 0 || platform::pollSockets(&p, 1, wait, &err) <= 0) return std::nullopt;
    if (auto f = read()) return f;
  }
  return std::nullopt;
}

}  // namespace cyxwiz::comm
