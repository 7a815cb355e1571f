// The same duplex exchange through libuv: one uv_loop_t per process, uv_tcp_t connections (TCP_NODELAY
// as ours, kernel-default buffer sizes), uv_write of the whole send buffer (one uv_buf_t) and
// uv_read_start into the receive buffer: the alloc callback hands out the unfilled rest of the receive
// buffer, so bytes go straight from the socket into place with no copy, as in ours. Reading is started
// for each exchange and stopped when its bytes are in (the next exchange's bytes stay in the kernel
// until then: there is nowhere else to put them without a copy).
//
// What libuv does underneath on Linux (1.44, src/unix/stream.c): uv_write tries writev() at once and,
// if the socket takes only part, finishes from the loop on EPOLLOUT; reading is one read() per alloc
// callback, on EPOLLIN, repeated while a read fills the whole buffer offered (at most 32 times).
#include <uv.h>

#include <memory>

#include "harness.h"

using bench::Clock;
using bench::fail;

namespace {

std::string uvText(const char* what, int rc) { return std::string(what) + ": " + uv_strerror(rc); }

void check(int rc, const char* what) {
  if (rc < 0) fail(uvText(what, rc));
}

class UvEndpoint : public bench::Endpoint {
 public:
  explicit UvEndpoint(const bench::Options& o) : spin_(o.spinUs), timeoutMs_(o.timeoutS * 1000) {
    check(uv_loop_init(&loop_), "uv_loop_init");
    check(uv_timer_init(&loop_, &watchdog_), "uv_timer_init");
    watchdog_.data = this;
  }

  ~UvEndpoint() override {
    uv_timer_stop(&watchdog_);
    uv_close(reinterpret_cast<uv_handle_t*>(&watchdog_), nullptr);
    if (listening_) uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    for (auto& t : links_) uv_close(reinterpret_cast<uv_handle_t*>(t.get()), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);  // runs the close callbacks
    uv_loop_close(&loop_);
  }

  int listenLoopback() override {
    check(uv_tcp_init(&loop_, &listener_), "uv_tcp_init");
    listener_.data = this;
    listening_ = true;
    sockaddr_in a{};
    check(uv_ip4_addr("127.0.0.1", 0, &a), "uv_ip4_addr");
    check(uv_tcp_bind(&listener_, reinterpret_cast<sockaddr*>(&a), 0), "uv_tcp_bind");
    check(uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 8, onConnection), "uv_listen");
    return port(&listener_, true);
  }

  std::vector<int> acceptLinks(int n, int timeoutMs) override {
    wanted_ = n;
    runUntil([&] { return static_cast<int>(links_.size()) >= wanted_; }, timeoutMs, "accept");
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);  // out of the loop before timing
    listening_ = false;
    uv_run(&loop_, UV_RUN_NOWAIT);
    std::vector<int> peers;
    for (auto& t : links_) peers.push_back(port(t.get(), false));
    return peers;
  }

  std::vector<int> connectLinks(int p, int n, int timeoutMs) override {
    std::vector<int> local;
    for (int i = 0; i < n; ++i) {
      auto t = std::make_unique<uv_tcp_t>();
      check(uv_tcp_init(&loop_, t.get()), "uv_tcp_init");
      t->data = this;
      uv_tcp_t* raw = t.get();
      links_.push_back(std::move(t));
      sockaddr_in a{};
      check(uv_ip4_addr("127.0.0.1", p, &a), "uv_ip4_addr");
      uv_connect_t req;
      req.data = this;
      connectStatus_ = 1;
      check(uv_tcp_connect(&req, raw, reinterpret_cast<sockaddr*>(&a), onConnect), "uv_tcp_connect");
      runUntil([&] { return connectStatus_ != 1; }, timeoutMs, "connect");
      check(connectStatus_, "connect");
      check(uv_tcp_nodelay(raw, 1), "uv_tcp_nodelay");
      local.push_back(port(raw, true));
    }
    return local;
  }

  void useLinks(int sendLink, int recvLink) override {
    out_ = links_.at(static_cast<size_t>(sendLink)).get();
    in_ = links_.at(static_cast<size_t>(recvLink)).get();
    wreq_.data = this;
    // No progress for --timeout-s: fail (checked by a repeating timer; nothing to do per exchange).
    check(uv_timer_start(&watchdog_, onWatchdog, static_cast<uint64_t>(timeoutMs_), static_cast<uint64_t>(timeoutMs_)),
          "uv_timer_start");
  }

  std::string describe() const override {
    return std::string("libuv ") + uv_version_string() + " (uv_write = writev, uv_read_start = read() per alloc_cb, epoll)";
  }

  void exchange(const char* send, char* recv, size_t bytes) override {
    recvPtr_ = recv;
    recvLeft_ = bytes;
    sendDone_ = false;
    err_ = 0;
    check(uv_read_start(reinterpret_cast<uv_stream_t*>(in_), onAlloc, onRead), "uv_read_start");
    uv_buf_t b;
    b.base = const_cast<char*>(send);
    b.len = bytes;
    check(uv_write(&wreq_, reinterpret_cast<uv_stream_t*>(out_), &b, 1, onWrite), "uv_write");
    Clock::time_point idleSince{};
    uint64_t seen = progress_;
    while (!(sendDone_ && recvLeft_ == 0)) {
      if (stalled_) fail("exchange: no progress within --timeout-s");
      if (err_ != 0) fail(uvText("exchange", err_));
      uv_run_mode mode = UV_RUN_ONCE;
      if (spin_ > 0) {
        // As ours: poll without sleeping until nothing has moved for spin_ microseconds.
        auto now = Clock::now();
        if (progress_ != seen) {
          seen = progress_;
          idleSince = now;
        } else if (idleSince == Clock::time_point{}) {
          idleSince = now;
        }
        if (now - idleSince < std::chrono::microseconds(spin_)) mode = UV_RUN_NOWAIT;
      }
      if (uv_run(&loop_, mode) == 0 && !(sendDone_ && recvLeft_ == 0) && err_ == 0) {
        fail("exchange: the loop has nothing left to wait for");
      }
    }
    if (err_ != 0) fail(uvText("exchange", err_));
  }

 private:
  template <class Pred>
  void runUntil(Pred done, int timeoutMs, const char* what) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
    check(uv_timer_start(&watchdog_, [](uv_timer_t*) {}, 50, 50), "uv_timer_start");  // wake up to check
    while (!done()) {
      if (Clock::now() > deadline) fail(std::string(what) + ": timed out");
      uv_run(&loop_, UV_RUN_ONCE);
    }
    uv_timer_stop(&watchdog_);
  }

  static int port(uv_tcp_t* t, bool local) {
    sockaddr_in a{};
    int len = sizeof a;
    int rc = local ? uv_tcp_getsockname(t, reinterpret_cast<sockaddr*>(&a), &len)
               : uv_tcp_getpeername(t, reinterpret_cast<sockaddr*>(&a), &len);
    check(rc, local ? "uv_tcp_getsockname" : "uv_tcp_getpeername");
    return ntohs(a.sin_port);
  }

  static void onConnection(uv_stream_t* server, int status) {
    auto* self = static_cast<UvEndpoint*>(server->data);
    if (status < 0) {
      std::fprintf(stderr, "uv: listen: %s\n", uv_strerror(status));
      return;
    }
    auto t = std::make_unique<uv_tcp_t>();
    if (uv_tcp_init(server->loop, t.get()) != 0) return;
    t->data = self;
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(t.get())) != 0) {
      uv_close(reinterpret_cast<uv_handle_t*>(t.release()), [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
      return;
    }
    uv_tcp_nodelay(t.get(), 1);
    self->links_.push_back(std::move(t));
  }

  static void onConnect(uv_connect_t* req, int status) { static_cast<UvEndpoint*>(req->data)->connectStatus_ = status; }

  static void onAlloc(uv_handle_t* h, size_t /*suggested: 64 KiB*/, uv_buf_t* buf) {
    auto* self = static_cast<UvEndpoint*>(h->data);
    buf->base = self->recvPtr_;  // the rest of the receive buffer: read() lands in place
    buf->len = self->recvLeft_;
  }

  static void onRead(uv_stream_t* s, ssize_t nread, const uv_buf_t*) {
    auto* self = static_cast<UvEndpoint*>(s->data);
    if (nread > 0) {
      self->recvPtr_ += nread;
      self->recvLeft_ -= static_cast<size_t>(nread);
      ++self->progress_;
      if (self->recvLeft_ == 0) uv_read_stop(s);  // this exchange's bytes are in
    } else if (nread < 0) {  // UV_EOF or an error (0 is EAGAIN: nothing to do)
      self->err_ = static_cast<int>(nread);
      uv_read_stop(s);
    }
  }

  static void onWrite(uv_write_t* req, int status) {
    auto* self = static_cast<UvEndpoint*>(req->data);
    if (status < 0) self->err_ = status;
    self->sendDone_ = true;
    ++self->progress_;
  }

  static void onWatchdog(uv_timer_t* t) {
    auto* self = static_cast<UvEndpoint*>(t->data);
    if (self->progress_ == self->watchdogSeen_ && (!self->sendDone_ || self->recvLeft_ != 0)) {
      self->err_ = UV_ETIMEDOUT;
      self->stalled_ = true;
    }
    self->watchdogSeen_ = self->progress_;
  }

  long spin_;
  int timeoutMs_;
  uv_loop_t loop_;
  uv_timer_t watchdog_;
  uv_tcp_t listener_;
  bool listening_ = false;
  int wanted_ = 0;
  int connectStatus_ = 1;
  std::vector<std::unique_ptr<uv_tcp_t>> links_;
  uv_tcp_t* out_ = nullptr;
  uv_tcp_t* in_ = nullptr;
  uv_write_t wreq_;
  char* recvPtr_ = nullptr;
  size_t recvLeft_ = 0;
  bool sendDone_ = true;
  int err_ = 0;
  bool stalled_ = false;  // err_ came from the watchdog timer
  uint64_t progress_ = 0, watchdogSeen_ = ~uint64_t{0};
};

bench::Endpoint* make(const bench::Options& o) { return new UvEndpoint(o); }

}  // namespace

int main(int argc, char** argv) { return bench::runBenchmark(argc, argv, "uv", make); }
