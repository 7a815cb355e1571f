// A TCP socket that owns its descriptor, and deadline-bounded I/O on it.
//
// Status values stay inside this layer (IoStatus, errno); callers that know the peer (Pair, the
// store) turn them into exceptions that name the rank, the address and the operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/platform/net.h"

namespace cyxwiz::comm::tcp {

struct IoStatus {
  enum Kind { Ok, Closed, TimedOut, Failed } kind = Ok;
  int err = 0;       // errno for Failed
  size_t done = 0;   // bytes moved before it stopped
  bool ok() const { return kind == Ok; }
  std::string describe() const;  // "closed by the peer", "timed out", "Connection reset by peer"
};

class Socket {
 public:
  Socket() = default;
  explicit Socket(platform::SocketHandle fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = platform::kNoSocket; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  platform::SocketHandle fd() const { return fd_; }
  bool valid() const { return fd_ != platform::kNoSocket; }
  void close();

  // Listens on the IPv4 address `ip` ("" = every interface); port 0 picks a free one. Returns an
  // invalid socket and sets `err` (EADDRINUSE, EADDRNOTAVAIL, ...) when it cannot be bound.
  static Socket listenOn(const std::string& ip, int port, int backlog, int* err);
  // One connection attempt to host:port; invalid socket + errno in `err` on failure (ECONNREFUSED,
  // ETIMEDOUT when the deadline passes, EHOSTUNREACH, or EAI_* name errors reported as ENOENT).
  static Socket connectTo(const std::string& host, int port, Deadline deadline, int* err);
  // One incoming connection if one is pending; else an invalid socket and errno in `err` (EAGAIN
  // when none is pending, EMFILE/ENFILE when this process has no descriptor left).
  Socket acceptNow(int* err) const;

  void setNonBlocking();
  void setNoDelay();
  void setBufferSizes(int bytes);
  // Keepalive probes after timeoutMs/3 of silence and a bound of 1.5 x timeoutMs on unacknowledged
  // data or probes (TCP_USER_TIMEOUT): a peer whose machine stops answering (a cut cable, a host
  // that is down) ends the connection with ETIMEDOUT even while nothing is sent. Longer than the
  // timeout, so that a peer that is only stopped (its kernel still answers) meets the timeout first.
  void setLiveness(int64_t timeoutMs);
  // Ends both directions but keeps the descriptor: a call blocked on it on another thread returns
  // at once, and the number cannot be reused by another socket or file until close().
  void shutdownBoth() const;
  // True when the peer's machine is not answering: data or probes outstanding and unacknowledged
  // (TCP_INFO where the system has it; else always false). A peer whose process is stopped still acknowledges: false. `silentMs`: how long
  // since it last acknowledged anything.
  bool peerUnresponsive(int64_t* silentMs) const;

  std::string peerAddress() const;   // "10.0.0.5:41234"
  std::string localIp() const;       // the interface this socket uses, "10.0.0.7"
  int localPort() const;

  IoStatus sendAll(const void* data, size_t n, Deadline deadline) const;
  IoStatus recvAll(void* data, size_t n, Deadline deadline) const;
  // Reads whatever is there (up to n) without waiting; 0 bytes + Ok when nothing is pending.
  IoStatus recvSome(void* data, size_t n) const;
  // Writes what the kernel takes now (up to n) without waiting; 0 bytes + Ok when it takes nothing.
  IoStatus sendSome(const void* data, size_t n) const;

 private:
  platform::SocketHandle fd_ = platform::kNoSocket;
};

std::string errnoString(int err);
// ETIMEDOUT (TCP_USER_TIMEOUT, keepalive), EHOSTUNREACH, ENETUNREACH, ...: the peer's machine cannot be reached.
bool isUnreachableError(int err);
bool isLoopbackAddress(const std::string& ip);  // 127.x.x.x
// The address to listen on for a job whose ranks reach this machine as `host`: the loopback address
// for a loopback job ("127.0.0.1", "localhost"), else the IPv4 address `host` resolves to; "" (every
// interface) for a name that resolves to loopback here but names the machine for others (Debian's
// 127.0.1.1) or one that does not resolve.
std::string listenAddressFor(const std::string& host);
// The first IPv4 address of an interface that is up and not loopback; "" when there is none.
std::string firstExternalIp();

}  // namespace cyxwiz::comm::tcp
