// The duplex exchange through pycyxwiz's platform layer (cyxwiz/platform/net.h, POSIX implementation):
// the same calls and the same loop as cpp/cyxwiz/comm/tcp/duplex.cpp's Duplex::run, reduced to one
// buffer each way: try a gathered send (sendmsg) to the right neighbour, try a scattered receive
// (recvmsg) from the left one, and only when neither moved a byte (after the optional spin) sleep in
// poll() on both. Connections as the transport makes them: non-blocking, close-on-exec, TCP_NODELAY,
// kernel-default buffer sizes.
#include <arpa/inet.h>

#include <climits>

#include "cyxwiz/platform/net.h"
#include "harness.h"

namespace net = cyxwiz::platform;
using bench::Clock;
using bench::fail;

namespace {

bool wouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

class OursEndpoint : public bench::Endpoint {
 public:
  explicit OursEndpoint(const bench::Options& o) : spin_(o.spinUs), timeoutMs_(o.timeoutS * 1000) {}
  ~OursEndpoint() override {
    net::closeSocket(listener_);
    for (auto s : links_) net::closeSocket(s);
  }

  int listenLoopback() override {
    int err = 0;
    listener_ = net::openStreamSocket(AF_INET, &err);
    if (listener_ == net::kNoSocket) fail(bench::errnoText("socket", err));
    net::allowAddressReuse(listener_);
    sockaddr_in a = loopback(0);
    if (::bind(static_cast<int>(listener_), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(static_cast<int>(listener_), 8) != 0) {
      fail(bench::errnoText("bind/listen", net::lastSocketError()));
    }
    net::setNonBlocking(listener_);
    return localPort(listener_);
  }

  std::vector<int> acceptLinks(int n, int timeoutMs) override {
    std::vector<int> peers;
    while (static_cast<int>(peers.size()) < n) {
      auto p = net::pollEntry(listener_, POLLIN);
      int err = 0;
      int rc = net::pollSockets(&p, 1, timeoutMs, &err);
      if (rc == 0) fail("accept: timed out");
      if (rc < 0) {
        if (err == EINTR) continue;
        fail(bench::errnoText("poll", err));
      }
      net::SocketHandle s = net::acceptConnection(listener_, &err);
      if (s == net::kNoSocket) {
        if (err == EAGAIN) continue;
        fail(bench::errnoText("accept", err));
      }
      net::setSocketOption(s, IPPROTO_TCP, TCP_NODELAY, 1);  // as Socket::acceptNow
      links_.push_back(s);
      sockaddr_in a{};
      socklen_t len = sizeof a;
      ::getpeername(static_cast<int>(s), reinterpret_cast<sockaddr*>(&a), &len);
      peers.push_back(ntohs(a.sin_port));
    }
    return peers;
  }

  std::vector<int> connectLinks(int port, int n, int timeoutMs) override {
    std::vector<int> local;
    for (int i = 0; i < n; ++i) {
      int err = 0;
      net::SocketHandle s = net::openStreamSocket(AF_INET, &err);
      if (s == net::kNoSocket) fail(bench::errnoText("socket", err));
      links_.push_back(s);
      net::setNonBlocking(s);
      sockaddr_in a = loopback(port);
      int rc = net::startConnect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
      if (rc == EINPROGRESS) {
        auto p = net::pollEntry(s, POLLOUT);
        int perr = 0;
        int k;
        do k = net::pollSockets(&p, 1, timeoutMs, &perr);
        while (k < 0 && perr == EINTR);
        if (k <= 0) fail("connect: timed out");
        rc = net::pendingError(s);
      }
      if (rc != 0) fail(bench::errnoText("connect", rc));
      net::setSocketOption(s, IPPROTO_TCP, TCP_NODELAY, 1);
      local.push_back(localPort(s));
    }
    return local;
  }

  void useLinks(int sendLink, int recvLink) override {
    out_ = links_.at(static_cast<size_t>(sendLink));
    in_ = links_.at(static_cast<size_t>(recvLink));
  }

  std::string describe() const override {
    return "pycyxwiz platform layer (sendGathered/recvScattered = sendmsg/recvmsg, pollSockets = poll)";
  }

  // Duplex::run with one buffer each way and no reduction callbacks.
  void exchange(const char* send, char* recv, size_t bytes) override {
    size_t sent = 0, got = 0;
    net::IoVec iov[1];
    Clock::time_point idleSince{};
    Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeoutMs_);
    bool progressed = false;
    while (sent < bytes || got < bytes) {
      bool moved = false;
      if (sent < bytes) {
        int err = 0;
        iov[0] = {const_cast<char*>(send) + sent, bytes - sent};
        int64_t k = net::sendGathered(out_, iov, 1, &err);
        if (k > 0) {
          sent += static_cast<size_t>(k);
          moved = true;
        } else if (k < 0 && !wouldBlock(err)) {
          fail(bench::errnoText("send", err));
        }
      }
      if (got < bytes) {
        int err = 0;
        iov[0] = {recv + got, bytes - got};
        int64_t k = net::recvScattered(in_, iov, 1, &err);
        if (k > 0) {
          got += static_cast<size_t>(k);
          moved = true;
        } else if (k == 0) {
          fail("receive: the peer closed the connection");
        } else if (!wouldBlock(err)) {
          fail(bench::errnoText("receive", err));
        }
      }
      if (moved) {
        idleSince = Clock::time_point{};
        progressed = true;
        continue;
      }
      if (spin_ > 0) {
        auto now = Clock::now();
        if (idleSince == Clock::time_point{}) idleSince = now;
        if (now - idleSince < std::chrono::microseconds(spin_)) continue;
      }
      net::PollFd fds[2];
      int n = 0;
      if (sent < bytes) fds[n++] = net::pollEntry(out_, POLLOUT);
      if (got < bytes) fds[n++] = net::pollEntry(in_, POLLIN);
      const auto now = Clock::now();
      if (progressed) {
        progressed = false;
        deadline = now + std::chrono::milliseconds(timeoutMs_);
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
      int wait = left <= 0 ? 0 : left > INT_MAX ? INT_MAX : static_cast<int>(left);
      int err = 0;
      int rc = wait > 0 ? net::pollSockets(fds, static_cast<size_t>(n), wait, &err) : 0;
      if (rc < 0 && err != EINTR) fail(bench::errnoText("poll", err));
      if (rc == 0) fail("exchange: no progress within --timeout-s");
    }
  }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }
  static int localPort(net::SocketHandle s) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (::getsockname(static_cast<int>(s), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      fail(bench::errnoText("getsockname", net::lastSocketError()));
    }
    return ntohs(a.sin_port);
  }

  long spin_;
  int timeoutMs_;
  net::SocketHandle listener_ = net::kNoSocket;
  std::vector<net::SocketHandle> links_;
  net::SocketHandle out_ = net::kNoSocket, in_ = net::kNoSocket;
};

bench::Endpoint* make(const bench::Options& o) { return new OursEndpoint(o); }

}  // namespace

int main(int argc, char** argv) { return bench::runBenchmark(argc, argv, "ours", make); }
