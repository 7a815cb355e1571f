#include "cyxwiz/comm/tcp/socket.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::tcp {

std::string errnoString(int err) { return platform::errorText(err); }

bool isUnreachableError(int err) {
  return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN || err == ENETDOWN;
}

bool isLoopbackAddress(const std::string& ip) { return ip.rfind("127.", 0) == 0; }

std::string listenAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  char ip[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof ip);
  ::freeaddrinfo(res);
  bool loopbackName = isLoopbackAddress(host) || host == "localhost";
  if (isLoopbackAddress(ip) && !loopbackName) return "";
  return ip;
}

std::string firstExternalIp() { return platform::firstExternalIp(); }

std::string IoStatus::describe() const {
  switch (kind) {
    case Ok: return "ok";
    case Closed: return "connection closed by the peer";
    case TimedOut: return "timed out";
    case Failed: return errnoString(err);
  }
  return "?";
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = platform::kNoSocket;
  }
  return *this;
}

void Socket::close() {
  platform::closeSocket(fd_);
  fd_ = platform::kNoSocket;
}

namespace {

std::string formatAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return makeString(host, ":", port);
}

// Waits for `events` on fd; false when the deadline passed first.
bool waitFor(platform::SocketHandle fd, short events, Deadline deadline) {
  for (;;) {
    platform::PollFd p = platform::pollEntry(fd, events);
    int err = 0;
    int rc = platform::pollSockets(&p, 1, msUntil(deadline), &err);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (err != EINTR) return true;  // let the following call report the error
  }
}

}  // namespace

Socket Socket::listenOn(const std::string& ip, int port, int backlog, int* err) {
  Socket s(platform::openStreamSocket(AF_INET, err));
  if (!s.valid()) return Socket();
  // Lets a restarted job reuse a port still in TIME_WAIT; a port with a live listener stays refused
  // (Windows: its default already; there SO_REUSEADDR would let two listeners share a port).
  platform::allowAddressReuse(s.fd());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!ip.empty() && ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    *err = EADDRNOTAVAIL;
    return Socket();
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s.fd(), backlog) != 0) {
    *err = platform::lastSocketError();
    return Socket();
  }
  s.setNonBlocking();
  *err = 0;
  return s;
}

Socket Socket::connectTo(const std::string& host, int port, Deadline deadline, int* err) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr) {
    *err = ENOENT;
    return Socket();
  }
  Socket s(platform::openStreamSocket(res->ai_family, err));
  if (!s.valid()) {
    ::freeaddrinfo(res);
    return Socket();
  }
  s.setNonBlocking();
  int rc = platform::startConnect(s.fd(), res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0 && rc != EINPROGRESS) {
    *err = rc;
    return Socket();
  }
  if (rc != 0) {
    if (!waitFor(s.fd(), POLLOUT, deadline)) {
      *err = ETIMEDOUT;
      return Socket();
    }
    int soerr = platform::pendingError(s.fd());
    if (soerr != 0) {
      *err = soerr;
      return Socket();
    }
  }
  s.setNoDelay();
  *err = 0;
  return s;
}

Socket Socket::acceptNow(int* err) const {
  Socket s(platform::acceptConnection(fd_, err));
  if (s.valid()) {
    s.setNoDelay();
    *err = 0;
  }
  return s;
}

void Socket::setNonBlocking() { platform::setNonBlocking(fd_); }

void Socket::setNoDelay() { platform::setSocketOption(fd_, IPPROTO_TCP, TCP_NODELAY, 1); }

void Socket::setBufferSizes(int bytes) {
  platform::setSocketOption(fd_, SOL_SOCKET, SO_SNDBUF, bytes);
  platform::setSocketOption(fd_, SOL_SOCKET, SO_RCVBUF, bytes);
}

void Socket::setLiveness(int64_t timeoutMs) { platform::setTcpLiveness(fd_, timeoutMs); }

void Socket::shutdownBoth() const { platform::shutdownSocket(fd_); }

bool Socket::peerUnresponsive(int64_t* silentMs) const { return platform::tcpPeerUnresponsive(fd_, silentMs); }

std::string Socket::peerAddress() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return formatAddress(ss);
}

std::string Socket::localIp() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "127.0.0.1";
  std::string a = formatAddress(ss);
  return a.substr(0, a.rfind(':'));
}

int Socket::localPort() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

IoStatus Socket::sendAll(const void* data, size_t n, Deadline deadline) const {
  IoStatus st;
  const char* p = static_cast<const char*>(data);
  while (st.done < n) {
    int err = 0;
    int64_t k = platform::sendNow(fd_, p + st.done, n - st.done, &err);
    if (k > 0) {
      st.done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && err == EINTR) continue;
    if (k < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      if (!waitFor(fd_, POLLOUT, deadline)) return {IoStatus::TimedOut, 0, st.done};
      continue;
    }
    if (k < 0 && (err == EPIPE || err == ECONNRESET)) return {IoStatus::Closed, err, st.done};
    return {IoStatus::Failed, err, st.done};
  }
  return st;
}

IoStatus Socket::recvAll(void* data, size_t n, Deadline deadline) const {
  IoStatus st;
  char* p = static_cast<char*>(data);
  while (st.done < n) {
    int err = 0;
    int64_t k = platform::recvNow(fd_, p + st.done, n - st.done, &err);
    if (k > 0) {
      st.done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return {IoStatus::Closed, 0, st.done};
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (!waitFor(fd_, POLLIN, deadline)) return {IoStatus::TimedOut, 0, st.done};
      continue;
    }
    if (err == ECONNRESET) return {IoStatus::Closed, err, st.done};
    return {IoStatus::Failed, err, st.done};
  }
  return st;
}

IoStatus Socket::recvSome(void* data, size_t n) const {
  for (;;) {
    int err = 0;
    int64_t k = platform::recvNow(fd_, data, n, &err);
    if (k > 0) return {IoStatus::Ok, 0, static_cast<size_t>(k)};
    if (k == 0) return {IoStatus::Closed, 0, 0};
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return {IoStatus::Ok, 0, 0};
    if (err == ECONNRESET) return {IoStatus::Closed, err, 0};
    return {IoStatus::Failed, err, 0};
  }
}

IoStatus Socket::sendSome(const void* data, size_t n) const {
  for (;;) {
    int err = 0;
    int64_t k = platform::sendNow(fd_, data, n, &err);
    if (k >= 0) return {IoStatus::Ok, 0, static_cast<size_t>(k)};
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return {IoStatus::Ok, 0, 0};
    if (err == EPIPE || err == ECONNRESET) return {IoStatus::Closed, err, 0};
    return {IoStatus::Failed, err, 0};
  }
}

}  // namespace cyxwiz::comm::tcp
