#include "cyxwiz/comm/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::tcp {

std::string errnoString(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof buf));
}

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

std::string firstExternalIp() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, host, sizeof host);
    found = host;
  }
  ::freeifaddrs(list);
  return found;
}

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
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
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
bool waitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, msUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the following syscall report the error
  }
}

}  // namespace

Socket Socket::listenOn(const std::string& ip, int port, int backlog, int* err) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    *err = errno;
    return Socket();
  }
  // Lets a restarted job reuse a port still in TIME_WAIT; a port with a live listener stays refused.
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!ip.empty() && ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    *err = EADDRNOTAVAIL;
    return Socket();
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s.fd(), backlog) != 0) {
    *err = errno;
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
  Socket s(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    *err = errno;
    ::freeaddrinfo(res);
    return Socket();
  }
  s.setNonBlocking();
  int rc = ::connect(s.fd(), res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0 && errno != EINPROGRESS) {
    *err = errno;
    return Socket();
  }
  if (rc != 0) {
    if (!waitFor(s.fd(), POLLOUT, deadline)) {
      *err = ETIMEDOUT;
      return Socket();
    }
    int soerr = 0;
    socklen_t len = sizeof soerr;
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &soerr, &len);
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
  for (;;) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Socket s(fd);
      s.setNoDelay();
      *err = 0;
      return s;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    *err = errno;
    return Socket();
  }
}

void Socket::setNonBlocking() {
  int flags = ::fcntl(fd_, F_GETFL, 0);
  ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

void Socket::setNoDelay() {
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void Socket::setBufferSizes(int bytes) {
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

void Socket::setLiveness(int64_t timeoutMs) {
  auto seconds = [](int64_t ms) { return static_cast<int>(std::clamp<int64_t>(ms / 1000, 1, 3600)); };
  int one = 1, idle = seconds(timeoutMs / 3), interval = seconds(timeoutMs / 6);
  unsigned userTimeout = static_cast<unsigned>(std::clamp<int64_t>(timeoutMs + timeoutMs / 2, 1000, INT_MAX));
  ::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof userTimeout);
}

void Socket::shutdownBoth() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool Socket::peerUnresponsive(int64_t* silentMs) const {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (fd_ < 0 || ::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  *silentMs = info.tcpi_last_ack_recv;
  // Retransmitted data or keepalive/window probes still unanswered: its kernel is not there.
  return info.tcpi_probes > 0 || (info.tcpi_unacked > 0 && info.tcpi_retransmits > 0);
}

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
    ssize_t k = ::send(fd_, p + st.done, n - st.done, MSG_NOSIGNAL);
    if (k > 0) {
      st.done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitFor(fd_, POLLOUT, deadline)) return {IoStatus::TimedOut, 0, st.done};
      continue;
    }
    if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) return {IoStatus::Closed, errno, st.done};
    return {IoStatus::Failed, errno, st.done};
  }
  return st;
}

IoStatus Socket::recvAll(void* data, size_t n, Deadline deadline) const {
  IoStatus st;
  char* p = static_cast<char*>(data);
  while (st.done < n) {
    ssize_t k = ::recv(fd_, p + st.done, n - st.done, 0);
    if (k > 0) {
      st.done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return {IoStatus::Closed, 0, st.done};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitFor(fd_, POLLIN, deadline)) return {IoStatus::TimedOut, 0, st.done};
      continue;
    }
    if (errno == ECONNRESET) return {IoStatus::Closed, errno, st.done};
    return {IoStatus::Failed, errno, st.done};
  }
  return st;
}

IoStatus Socket::recvSome(void* data, size_t n) const {
  for (;;) {
    ssize_t k = ::recv(fd_, data, n, MSG_DONTWAIT);
    if (k > 0) return {IoStatus::Ok, 0, static_cast<size_t>(k)};
    if (k == 0) return {IoStatus::Closed, 0, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {IoStatus::Ok, 0, 0};
    if (errno == ECONNRESET) return {IoStatus::Closed, errno, 0};
    return {IoStatus::Failed, errno, 0};
  }
}

IoStatus Socket::sendSome(const void* data, size_t n) const {
  for (;;) {
    ssize_t k = ::send(fd_, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k >= 0) return {IoStatus::Ok, 0, static_cast<size_t>(k)};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {IoStatus::Ok, 0, 0};
    if (errno == EPIPE || errno == ECONNRESET) return {IoStatus::Closed, errno, 0};
    return {IoStatus::Failed, errno, 0};
  }
}

}  // namespace cyxwiz::comm::tcp
