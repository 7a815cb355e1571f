#include "cyxwiz/platform/net.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

// MSG_NOSIGNAL is Linux's; macOS sets SO_NOSIGPIPE on the socket instead (openStreamSocket).
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

namespace cyxwiz::platform {

namespace {

int fdOf(SocketHandle s) { return static_cast<int>(s); }

[[maybe_unused]] void setCloseOnExec(int fd) { ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC); }

int64_t result(ssize_t k, int* err) {
  if (k < 0) *err = errno;
  return k;
}

}  // namespace

SocketHandle openStreamSocket(int family, int* err) {
#if defined(SOCK_CLOEXEC)
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
#else
  int fd = ::socket(family, SOCK_STREAM, 0);
  if (fd >= 0) setCloseOnExec(fd);
#endif
  if (fd < 0) {
    *err = errno;
    return kNoSocket;
  }
#if defined(SO_NOSIGPIPE)
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
  return fd;
}

void closeSocket(SocketHandle s) {
  if (s != kNoSocket) ::close(fdOf(s));
}

void setNonBlocking(SocketHandle s) {
  int flags = ::fcntl(fdOf(s), F_GETFL, 0);
  ::fcntl(fdOf(s), F_SETFL, flags | O_NONBLOCK);
}

SocketHandle acceptConnection(SocketHandle listener, int* err) {
  for (;;) {
#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
    int fd = ::accept4(fdOf(listener), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
#else
    int fd = ::accept(fdOf(listener), nullptr, nullptr);
    if (fd >= 0) {
      setCloseOnExec(fd);
      setNonBlocking(fd);
#if defined(SO_NOSIGPIPE)
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    }
#endif
    if (fd >= 0) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    *err = errno;
    return kNoSocket;
  }
}

int startConnect(SocketHandle s, const sockaddr* addr, size_t len) {
  if (::connect(fdOf(s), addr, static_cast<socklen_t>(len)) == 0) return 0;
  return errno;
}

int lastSocketError() { return errno; }

int64_t sendNow(SocketHandle s, const void* data, size_t n, int* err) {
  return result(::send(fdOf(s), data, n, MSG_NOSIGNAL | MSG_DONTWAIT), err);
}

int64_t recvNow(SocketHandle s, void* data, size_t n, int* err) {
  return result(::recv(fdOf(s), data, n, MSG_DONTWAIT), err);
}

int64_t sendGathered(SocketHandle s, const IoVec* iov, int count, int* err) {
  msghdr m{};
  m.msg_iov = const_cast<IoVec*>(iov);
  m.msg_iovlen = static_cast<decltype(m.msg_iovlen)>(count);
  return result(::sendmsg(fdOf(s), &m, MSG_NOSIGNAL | MSG_DONTWAIT), err);
}

int64_t recvScattered(SocketHandle s, const IoVec* iov, int count, int* err) {
  msghdr m{};
  m.msg_iov = const_cast<IoVec*>(iov);
  m.msg_iovlen = static_cast<decltype(m.msg_iovlen)>(count);
  return result(::recvmsg(fdOf(s), &m, MSG_DONTWAIT), err);
}

int pollSockets(PollFd* fds, size_t n, int timeoutMs, int* err) {
  int rc = ::poll(fds, static_cast<nfds_t>(n), timeoutMs);
  if (rc < 0) *err = errno;
  return rc;
}

void setSocketOption(SocketHandle s, int level, int name, int value) {
  ::setsockopt(fdOf(s), level, name, &value, sizeof value);
}

void allowAddressReuse(SocketHandle s) { setSocketOption(s, SOL_SOCKET, SO_REUSEADDR, 1); }

int pendingError(SocketHandle s) {
  int soerr = 0;
  socklen_t len = sizeof soerr;
  if (::getsockopt(fdOf(s), SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) return errno;
  return soerr;
}

void shutdownSocket(SocketHandle s) {
  if (s != kNoSocket) ::shutdown(fdOf(s), SHUT_RDWR);
}

void setTcpLiveness(SocketHandle s, int64_t timeoutMs) {
  auto seconds = [](int64_t ms) { return static_cast<int>(std::clamp<int64_t>(ms / 1000, 1, 3600)); };
  const int idle = seconds(timeoutMs / 3), interval = seconds(timeoutMs / 6);
  const int64_t boundMs = std::clamp<int64_t>(timeoutMs + timeoutMs / 2, 1000, INT_MAX);
  setSocketOption(s, SOL_SOCKET, SO_KEEPALIVE, 1);
#if defined(TCP_KEEPIDLE)
  setSocketOption(s, IPPROTO_TCP, TCP_KEEPIDLE, idle);
#elif defined(TCP_KEEPALIVE)  // macOS
  setSocketOption(s, IPPROTO_TCP, TCP_KEEPALIVE, idle);
#endif
#if defined(TCP_KEEPINTVL)
  setSocketOption(s, IPPROTO_TCP, TCP_KEEPINTVL, interval);
#endif
#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
  setSocketOption(s, IPPROTO_TCP, TCP_USER_TIMEOUT, static_cast<int>(boundMs));
#elif defined(TCP_RXT_CONNDROPTIME)  // macOS: drop after this long retransmitting
  setSocketOption(s, IPPROTO_TCP, TCP_RXT_CONNDROPTIME, seconds(boundMs));
#else
  (void)boundMs;  // portable POSIX: keepalive alone; the collective's timeout bounds the rest
#endif
}

bool tcpPeerUnresponsive(SocketHandle s, int64_t* silentMs) {
#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
  tcp_info info{};
  socklen_t len = sizeof info;
  if (s == kNoSocket || ::getsockopt(fdOf(s), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  *silentMs = info.tcpi_last_ack_recv;
  // Retransmitted data or keepalive/window probes still unanswered: its kernel is not there.
  return info.tcpi_probes > 0 || (info.tcpi_unacked > 0 && info.tcpi_retransmits > 0);
#else
  (void)s;
  (void)silentMs;
  return false;
#endif
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

std::string errorText(int err) { return std::strerror(err); }

}  // namespace cyxwiz::platform
