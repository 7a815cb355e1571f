// Sockets: the BSD socket API as POSIX and Winsock2 share it (socket, bind, listen, connect,
// getaddrinfo, setsockopt, getsockname, ...), plus what differs between them behind one function
// each: handle type, closing, non-blocking mode, polling, gathered I/O, error codes, TCP liveness.
//
// Errors are reported in the errno domain on every platform (EAGAIN, ECONNREFUSED, ...): Winsock's
// WSAE* codes are translated, so the transports compare one set of codes and print one set of texts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <winsock2.h>
#include <ws2tcpip.h>
#include <cerrno>
#ifndef EHOSTDOWN
#define EHOSTDOWN 10064  // Windows' own value (WSAEHOSTDOWN); its errno.h lacks the name
#endif
#else
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <cerrno>
#endif

namespace cyxwiz::platform {

#if defined(_WIN32)
using SocketHandle = intptr_t;  // a SOCKET; INVALID_SOCKET is ~0, which reads -1 here
using PollFd = WSAPOLLFD;       // {fd, events, revents}, POLLIN/POLLOUT/POLLHUP/POLLERR as on POSIX
struct IoVec {
  void* iov_base;
  size_t iov_len;
};
#else
using SocketHandle = intptr_t;  // a descriptor
using PollFd = pollfd;
using IoVec = iovec;
#endif
constexpr SocketHandle kNoSocket = -1;

// A poll entry for `s` (kNoSocket: skipped); POLLIN/POLLOUT as `events`.
inline PollFd pollEntry(SocketHandle s, int events) {
  PollFd p{};
  p.fd = static_cast<decltype(p.fd)>(s);
  p.events = static_cast<short>(events);
  return p;
}

// A TCP (IPv4 or IPv6) stream socket that child processes do not inherit; kNoSocket and *err on failure.
SocketHandle openStreamSocket(int family, int* err);
void closeSocket(SocketHandle s);
void setNonBlocking(SocketHandle s);
// One pending connection, non-blocking and not inherited; kNoSocket and *err (EAGAIN: none pending,
// EMFILE/ENFILE: no descriptor left) otherwise. ECONNABORTED and EINTR are retried inside.
SocketHandle acceptConnection(SocketHandle listener, int* err);
// connect() on a non-blocking socket: 0, EINPROGRESS while it proceeds, or the error.
int startConnect(SocketHandle s, const sockaddr* addr, size_t len);
// The errno-domain code of the last failed socket call on this thread.
int lastSocketError();
// Never raise SIGPIPE; never block (the socket may be blocking or not). Bytes moved, or -1 and *err.
int64_t sendNow(SocketHandle s, const void* data, size_t n, int* err);
int64_t recvNow(SocketHandle s, void* data, size_t n, int* err);
int64_t sendGathered(SocketHandle s, const IoVec* iov, int count, int* err);
int64_t recvScattered(SocketHandle s, const IoVec* iov, int count, int* err);
// poll() over sockets (and, on POSIX, any descriptor); entries with fd == kNoSocket are skipped.
// The count ready, 0 when timeoutMs passed, -1 and *err on failure (EINTR: call again).
int pollSockets(PollFd* fds, size_t n, int timeoutMs, int* err);
void setSocketOption(SocketHandle s, int level, int name, int value);
// Lets a listener bind a port still in TIME_WAIT, never one with a live listener (POSIX SO_REUSEADDR;
// Windows' default, where SO_REUSEADDR would mean sharing the port and SO_EXCLUSIVEADDRUSE is set).
void allowAddressReuse(SocketHandle s);
// SO_ERROR: what a non-blocking connect ended with (0: connected).
int pendingError(SocketHandle s);
void shutdownSocket(SocketHandle s);

// Keepalive probes after timeoutMs/3 of silence, and a bound on unacknowledged data or probes
// (Linux TCP_USER_TIMEOUT, Windows TCP_MAXRT, macOS TCP_CONNECTIONTIMEOUT/TCP_RXT_CONNDROPTIME)
// after which the connection fails with ETIMEDOUT: a peer machine that stops answering is noticed
// even while nothing is being sent. Best effort where an option is missing.
void setTcpLiveness(SocketHandle s, int64_t timeoutMs);
// True when data or keepalive probes are outstanding and unanswered (Linux TCP_INFO); *silentMs
// since the peer last acknowledged. Always false where the kernel does not say (the timeout decides).
bool tcpPeerUnresponsive(SocketHandle s, int64_t* silentMs);

// The first IPv4 address of an interface that is up and not loopback; "" when there is none.
std::string firstExternalIp();
// strerror for the errno-domain codes above (Windows' C runtime has no text for the network ones).
std::string errorText(int err);

}  // namespace cyxwiz::platform
