#include "cyxwiz/platform/net.h"

#include <mstcpip.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "cyxwiz/platform/windows/text.h"

#ifndef WSA_FLAG_NO_HANDLE_INHERIT
#define WSA_FLAG_NO_HANDLE_INHERIT 0x80
#endif
#ifndef TCP_MAXRT
#define TCP_MAXRT 5
#endif

namespace cyxwiz::platform {

namespace {

// Winsock must be started before the first getaddrinfo or socket: at load time, once.
const bool kWinsockStarted = [] {
  WSADATA data;
  return ::WSAStartup(MAKEWORD(2, 2), &data) == 0;
}();

SOCKET sock(SocketHandle s) { return static_cast<SOCKET>(s); }

int translate(int wsa) {
  switch (wsa) {
    case 0: return 0;
    case WSAEWOULDBLOCK: return EWOULDBLOCK;
    case WSAEINPROGRESS: case WSAEALREADY: return EINPROGRESS;
    case WSAEINTR: return EINTR;
    case WSAECONNREFUSED: return ECONNREFUSED;
    case WSAECONNRESET: return ECONNRESET;
    case WSAECONNABORTED: return ECONNABORTED;
    case WSAESHUTDOWN: return EPIPE;
    case WSAETIMEDOUT: return ETIMEDOUT;
    case WSAEHOSTUNREACH: return EHOSTUNREACH;
    case WSAENETUNREACH: return ENETUNREACH;
    case WSAENETDOWN: return ENETDOWN;
    case WSAEHOSTDOWN: return EHOSTDOWN;
    case WSAEADDRINUSE: return EADDRINUSE;
    case WSAEADDRNOTAVAIL: return EADDRNOTAVAIL;
    case WSAEMFILE: return EMFILE;
    case WSAENOBUFS: return ENOBUFS;
    case WSAENOTCONN: return ENOTCONN;
    case WSAEACCES: return EACCES;
    case WSAEINVAL: return EINVAL;
    case WSAENOTSOCK: return EBADF;
    default: return wsa;  // unknown: the WSAE* code itself; errorText() asks the system for its text
  }
}

int lastError() { return translate(::WSAGetLastError()); }

int64_t result(int k, int* err) {
  if (k == SOCKET_ERROR) {
    *err = lastError();
    return -1;
  }
  return k;
}

void notInherited(SOCKET s) { ::SetHandleInformation(reinterpret_cast<HANDLE>(s), HANDLE_FLAG_INHERIT, 0); }

std::vector<WSABUF> buffers(const IoVec* iov, int count) {
  std::vector<WSABUF> out(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    out[static_cast<size_t>(i)].buf = static_cast<char*>(iov[i].iov_base);
    out[static_cast<size_t>(i)].len = static_cast<ULONG>(std::min<size_t>(iov[i].iov_len, ULONG_MAX));
  }
  return out;
}

}  // namespace

SocketHandle openStreamSocket(int family, int* err) {
  SOCKET s = ::WSASocketW(family, SOCK_STREAM, IPPROTO_TCP, nullptr, 0, WSA_FLAG_OVERLAPPED | WSA_FLAG_NO_HANDLE_INHERIT);
  if (s == INVALID_SOCKET) {
    *err = kWinsockStarted ? lastError() : ENETDOWN;
    return kNoSocket;
  }
  return static_cast<SocketHandle>(s);
}

void closeSocket(SocketHandle s) {
  if (s != kNoSocket) ::closesocket(sock(s));
}

void setNonBlocking(SocketHandle s) {
  u_long one = 1;
  ::ioctlsocket(sock(s), FIONBIO, &one);
}

SocketHandle acceptConnection(SocketHandle listener, int* err) {
  for (;;) {
    SOCKET s = ::accept(sock(listener), nullptr, nullptr);  // inherits the listener's non-blocking mode
    if (s != INVALID_SOCKET) {
      notInherited(s);
      setNonBlocking(static_cast<SocketHandle>(s));
      return static_cast<SocketHandle>(s);
    }
    int e = lastError();
    if (e == EINTR || e == ECONNABORTED || e == ECONNRESET) continue;
    *err = e == EWOULDBLOCK ? EAGAIN : e;
    return kNoSocket;
  }
}

int startConnect(SocketHandle s, const sockaddr* addr, size_t len) {
  if (::connect(sock(s), addr, static_cast<int>(len)) == 0) return 0;
  int e = lastError();
  return e == EWOULDBLOCK ? EINPROGRESS : e;
}

int lastSocketError() { return lastError(); }

int64_t sendNow(SocketHandle s, const void* data, size_t n, int* err) {
  return result(::send(sock(s), static_cast<const char*>(data), static_cast<int>(std::min<size_t>(n, INT_MAX)), 0), err);
}

int64_t recvNow(SocketHandle s, void* data, size_t n, int* err) {
  return result(::recv(sock(s), static_cast<char*>(data), static_cast<int>(std::min<size_t>(n, INT_MAX)), 0), err);
}

int64_t sendGathered(SocketHandle s, const IoVec* iov, int count, int* err) {
  std::vector<WSABUF> b = buffers(iov, count);
  DWORD sent = 0;
  if (::WSASend(sock(s), b.data(), static_cast<DWORD>(b.size()), &sent, 0, nullptr, nullptr) != 0) {
    *err = lastError();
    return -1;
  }
  return static_cast<int64_t>(sent);
}

int64_t recvScattered(SocketHandle s, const IoVec* iov, int count, int* err) {
  std::vector<WSABUF> b = buffers(iov, count);
  DWORD got = 0, flags = 0;
  if (::WSARecv(sock(s), b.data(), static_cast<DWORD>(b.size()), &got, &flags, nullptr, nullptr) != 0) {
    *err = lastError();
    return -1;
  }
  return static_cast<int64_t>(got);
}

int pollSockets(PollFd* fds, size_t n, int timeoutMs, int* err) {
  // WSAPoll fails (WSAEINVAL) on an array with no socket in it: wait the time out instead.
  size_t live = 0;
  for (size_t i = 0; i < n; ++i) {
    fds[i].revents = 0;
    if (fds[i].fd != INVALID_SOCKET) ++live;
  }
  if (live == 0) {
    ::Sleep(static_cast<DWORD>(std::max(timeoutMs, 0)));
    return 0;
  }
  std::vector<WSAPOLLFD> active;
  std::vector<size_t> at;
  for (size_t i = 0; i < n; ++i) {
    if (fds[i].fd == INVALID_SOCKET) continue;
    active.push_back(fds[i]);
    at.push_back(i);
  }
  int rc = ::WSAPoll(active.data(), static_cast<ULONG>(active.size()), timeoutMs);
  if (rc == SOCKET_ERROR) {
    *err = lastError();
    return -1;
  }
  for (size_t k = 0; k < active.size(); ++k) fds[at[k]].revents = active[k].revents;
  return rc;
}

void setSocketOption(SocketHandle s, int level, int name, int value) {
  ::setsockopt(sock(s), level, name, reinterpret_cast<const char*>(&value), sizeof value);
}

void allowAddressReuse(SocketHandle s) {
  // Windows lets a listener bind a port whose old connections are in TIME_WAIT by default; its
  // SO_REUSEADDR would let a second process bind a port in use, which is what must never happen.
  setSocketOption(s, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, 1);
}

int pendingError(SocketHandle s) {
  int soerr = 0;
  int len = sizeof soerr;
  if (::getsockopt(sock(s), SOL_SOCKET, SO_ERROR, reinterpret_cast<char*>(&soerr), &len) != 0) return lastError();
  return translate(soerr);
}

void shutdownSocket(SocketHandle s) {
  if (s != kNoSocket) ::shutdown(sock(s), SD_BOTH);
}

void setTcpLiveness(SocketHandle s, int64_t timeoutMs) {
  const int64_t idleMs = std::clamp<int64_t>(timeoutMs / 3, 1000, 3600 * 1000);
  const int64_t intervalMs = std::clamp<int64_t>(timeoutMs / 6, 1000, 3600 * 1000);
  tcp_keepalive ka{};
  ka.onoff = 1;
  ka.keepalivetime = static_cast<ULONG>(idleMs);
  ka.keepaliveinterval = static_cast<ULONG>(intervalMs);
  DWORD returned = 0;
  ::WSAIoctl(sock(s), SIO_KEEPALIVE_VALS, &ka, sizeof ka, nullptr, 0, &returned, nullptr, nullptr);
  // Unacknowledged data is given up on after this many seconds (Windows' TCP_USER_TIMEOUT).
  const int64_t boundMs = timeoutMs + timeoutMs / 2;
  setSocketOption(s, IPPROTO_TCP, TCP_MAXRT, static_cast<int>(std::clamp<int64_t>(boundMs / 1000, 1, 3600)));
}

bool tcpPeerUnresponsive(SocketHandle, int64_t*) { return false; }

std::string firstExternalIp() {
  char host[256] = "";
  if (::gethostname(host, sizeof host) != 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host, nullptr, &hints, &res) != 0) return "";
  std::string found;
  for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
    char ip[INET_ADDRSTRLEN] = "";
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof ip);
    if (std::strncmp(ip, "127.", 4) != 0) found = ip;
  }
  ::freeaddrinfo(res);
  return found;
}

std::string errorText(int err) {
  switch (err) {
    case EWOULDBLOCK: return "Resource temporarily unavailable";
    case EINPROGRESS: return "Operation now in progress";
    case ECONNREFUSED: return "Connection refused";
    case ECONNRESET: return "Connection reset by peer";
    case ECONNABORTED: return "Software caused connection abort";
    case ETIMEDOUT: return "Connection timed out";
    case EHOSTUNREACH: return "No route to host";
    case ENETUNREACH: return "Network is unreachable";
    case ENETDOWN: return "Network is down";
    case EHOSTDOWN: return "Host is down";
    case EADDRINUSE: return "Address already in use";
    case EADDRNOTAVAIL: return "Cannot assign requested address";
    case ENOBUFS: return "No buffer space available";
    case ENOTCONN: return "Transport endpoint is not connected";
    default: break;
  }
  if (err >= WSABASEERR) return win::systemMessage(static_cast<unsigned long>(err));
  return std::strerror(err);
}

}  // namespace cyxwiz::platform
