// A pollable wake-up: one thread's signal() makes another's pollSockets() over handle() return.
// Linux: an eventfd; other POSIX systems: a pipe; Windows, where WSAPoll takes sockets only: a
// connected pair of loopback sockets.
#pragma once

#include <string>

#include "cyxwiz/platform/net.h"

namespace cyxwiz::platform {

class Wakeup {
 public:
  // Throws cyxwiz::NetworkError, its message led by `who` ("[rank 1/4] init: "), when the system has
  // no descriptor left (or, on Windows, the loopback pair cannot be made).
  explicit Wakeup(const std::string& who);
  ~Wakeup();
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  SocketHandle handle() const { return read_; }  // poll it for POLLIN
  void signal();                                  // async-signal and thread safe, never blocks
  void drain();                                   // after it polled readable

 private:
  SocketHandle read_ = kNoSocket, write_ = kNoSocket;
};

// A descriptor held back for the moment the process has none left (EMFILE): released, it lets a
// listener accept-and-close a newcomer instead of staying readable forever. Windows has no
// per-process descriptor limit of that kind: there it holds nothing and acceptAndClose() does no more.
class DescriptorReserve {
 public:
  DescriptorReserve();
  ~DescriptorReserve();
  DescriptorReserve(const DescriptorReserve&) = delete;
  DescriptorReserve& operator=(const DescriptorReserve&) = delete;
  // Frees the spare, accepts one connection on `listener` and closes it, takes the spare back.
  // True when a connection was shed and the spare is held again.
  bool acceptAndClose(SocketHandle listener);
  void release();

 private:
  intptr_t spare_ = -1;
};

// How many descriptors this process may open (RLIMIT_NOFILE; a generous default elsewhere).
size_t descriptorLimit();

}  // namespace cyxwiz::platform
