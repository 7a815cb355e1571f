#include "cyxwiz/platform/wakeup.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz::platform {

namespace {

[[noreturn]] void fail(const char* what, int err) {
  throw NetworkError(makeString("init: cannot make the wake-up socket pair (", what, "): ", errorText(err)));
}

}  // namespace

// WSAPoll takes sockets only: the wake-up is a connected pair of loopback sockets.
Wakeup::Wakeup() {
  int err = 0;
  SocketHandle listener = openStreamSocket(AF_INET, &err);
  if (listener == kNoSocket) fail("socket", err);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int len = sizeof addr;
  SOCKET l = static_cast<SOCKET>(listener);
  if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(l, 1) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    err = lastSocketError();
    closeSocket(listener);
    fail("listen", err);
  }
  write_ = openStreamSocket(AF_INET, &err);
  if (write_ == kNoSocket || ::connect(static_cast<SOCKET>(write_), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    err = write_ == kNoSocket ? err : lastSocketError();
    closeSocket(listener);
    fail("connect", err);
  }
  SOCKET r = ::accept(l, nullptr, nullptr);
  closeSocket(listener);
  if (r == INVALID_SOCKET) fail("accept", lastSocketError());
  read_ = static_cast<SocketHandle>(r);
  ::SetHandleInformation(reinterpret_cast<HANDLE>(r), HANDLE_FLAG_INHERIT, 0);
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
