// Duplex: one step (links.h) over TCP. Bytes go to one peer while bytes come from another, both sockets non-blocking under one poll(), so a rank never waits to send before it
// receives (which would deadlock a ring of full socket buffers). Received bytes are handed on in
// segments as they arrive, so reducing overlaps the rest of the transfer.
//
// The job monitor's socket is polled too: when another rank fails, this step stops at once with
// that rank's error. The timeout counts time without progress: the collective fails when no byte
// has moved either way for timeoutMs, however long it has been running while bytes kept moving.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "cyxwiz/comm/links.h"
#include "cyxwiz/comm/tcp/monitor.h"
#include "cyxwiz/comm/tcp/pair.h"
#include "cyxwiz/comm/work.h"

namespace cyxwiz::comm::tcp {

class Duplex {
 public:
  // `work` names the collective in every error message. `spin`: how long to retry without sleeping
  // when neither socket is ready (0 when ranks outnumber cores: spinning would starve a peer).
  // `interrupted` (may be null) is asked every 100 ms while waiting: true stops the step.
  // `deadline`: the first wait's (timeoutMs from the start of the collective); every byte moved
  // pushes it to timeoutMs after the next wait begins. `finalizing` (may be null): set when
  // finalize() shuts the links down under this call, which then says so.
  Duplex(Pair* left, Pair* right, Monitor* monitor, Deadline deadline, int64_t timeoutMs, const Work& work,
         std::chrono::microseconds spin, bool (*interrupted)(), const std::atomic<bool>* finalizing = nullptr);
  void run(Step& step);
  // Later steps receive from `from` and send to `to` (one partner for both in recursive doubling).
  void use(Pair* from, Pair* to) {
    left_ = from;
    right_ = to;
  }
  std::string what() const { return work_.description(); }

 private:
  [[noreturn]] void peerLost(const Pair& peer, bool receiving, int err, size_t done, size_t total);
  [[noreturn]] void timedOut(bool receiving, size_t done, size_t total);
  [[noreturn]] void unreachable(const Pair& peer, bool receiving, const std::string& why, size_t done, size_t total);
  void checkMonitor();
  [[noreturn]] void raiseNotice(const Failure& failure);

  Pair* left_;
  Pair* right_;
  Monitor* monitor_;
  Deadline deadline_;      // of the current wait: no progress by then is a timeout
  bool progressed_ = false;  // bytes moved since deadline_ was set (the clock is read only when a wait blocks)
  int64_t timeoutMs_;
  const Work& work_;
  std::chrono::microseconds spin_;
  bool (*interrupted_)();
  const std::atomic<bool>* finalizing_;
};

}  // namespace cyxwiz::comm::tcp
