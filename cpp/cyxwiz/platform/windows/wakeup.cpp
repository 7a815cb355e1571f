#include "cyxwiz/platform/wakeup.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz::platform {

namespace {

constexpr int kPairTimeoutMs = 10000;  // loopback: anything slower is a broken network stack

[[noreturn]] void fail(const std::string& who, const char* what, int err) {
  throw NetworkError(makeString(who, "cannot make the wake-up socket pair (", what, "): ", errorText(err),
                                "; check that the loopback interface (127.0.0.1) works and no firewall blocks it"));
}

bool sameAddress(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_family == b.sin_family && a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
}

}  // namespace

// WSAPoll takes sockets only: the wake-up is a connected pair of loopback sockets. Another local
// process may connect to the short-lived listener first: only the connection whose far end is our
// own socket is taken, and the wait for it is bounded.
Wakeup::Wakeup(const std::string& who) {
  int err = 0;
  SocketHandle listener = openStreamSocket(AF_INET, &err);
  if (listener == kNoSocket) fail(who, "socket", err);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int len = sizeof addr;
  SOCKET l = static_cast<SOCKET>(listener);
  if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(l, 4) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    err = lastSocketError();
    closeSocket(listener);
    fail(who, "listen", err);
  }
  setNonBlocking(listener);
  write_ = openStreamSocket(AF_INET, &err);
  sockaddr_in mine{};
  int mineLen = sizeof mine;
  if (write_ == kNoSocket || ::connect(static_cast<SOCKET>(write_), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(static_cast<SOCKET>(write_), reinterpret_cast<sockaddr*>(&mine), &mineLen) != 0) {
    err = write_ == kNoSocket ? err : lastSocketError();
    closeSocket(write_);
    closeSocket(listener);
    fail(who, "connect", err);
  }
  const ULONGLONG deadline = ::GetTickCount64() + kPairTimeoutMs;
  while (read_ == kNoSocket) {
    const ULONGLONG now = ::GetTickCount64();
    PollFd fd = pollEntry(listener, POLLIN);
    if (now >= deadline || pollSockets(&fd, 1, static_cast<int>(deadline - now), &err) < 0) {
      err = now >= deadline ? WSAETIMEDOUT : err;
      break;
    }
    sockaddr_in peer{};
    int peerLen = sizeof peer;
    SOCKET r = ::accept(l, reinterpret_cast<sockaddr*>(&peer), &peerLen);
    if (r == INVALID_SOCKET) continue;  // WSAEWOULDBLOCK: poll again
    if (sameAddress(peer, mine)) {
      read_ = static_cast<SocketHandle>(r);
    } else {
      ::closesocket(r);  // someone else's connection
    }
  }
  closeSocket(listener);
  if (read_ == kNoSocket) {
    closeSocket(write_);
    write_ = kNoSocket;
    fail(who, "accept", err);
  }
  ::SetHandleInformation(reinterpret_cast<HANDLE>(static_cast<SOCKET>(read_)), HANDLE_FLAG_INHERIT, 0);
  setNonBlocking(read_);
  setNonBlocking(write_);
  setSocketOption(write_, IPPROTO_TCP, TCP_NODELAY, 1);
}

Wakeup::~Wakeup() {
  closeSocket(write_);
  closeSocket(read_);
}

void Wakeup::signal() {
  char one = 1;
  ::send(static_cast<SOCKET>(write_), &one, 1, 0);  // WSAEWOULDBLOCK: a wake-up is already pending
}

void Wakeup::drain() {
  char buf[64];
  while (::recv(static_cast<SOCKET>(read_), buf, sizeof buf, 0) > 0) {
  }
}

DescriptorReserve::DescriptorReserve() = default;
DescriptorReserve::~DescriptorReserve() = default;
void DescriptorReserve::release() {}
bool DescriptorReserve::acceptAndClose(SocketHandle) { return false; }

// Windows limits sockets by memory, not by a descriptor count: enough for the gate's largest share.
size_t descriptorLimit() { return 4096; }

}  // namespace cyxwiz::platform
