// Duplex: one step of a ring algorithm. Bytes go to the right neighbour while bytes come from the
// left one, both sockets non-blocking under one poll(), so a rank never waits to send before it
// receives (which would deadlock a ring of full socket buffers). Received bytes are handed on in
// segments as they arrive, so reducing overlaps the rest of the transfer.
//
// The job monitor's socket is polled too: when another rank fails, this step stops at once with
// that rank's error. The timeout counts time without progress: the collective fails when no byte
// has moved either way for timeoutMs, however long it has been running while bytes kept moving.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "cyxwiz/comm/tcp/monitor.h"
#include "cyxwiz/comm/tcp/pair.h"
#include "cyxwiz/comm/work.h"

namespace cyxwiz::comm::tcp {

struct Step {
  std::vector<iovec> send;  // to the right neighbour, in order
  std::vector<iovec> recv;  // from the left neighbour, in order
  // The first recvHeaderBytes of recv go to onHeader as soon as they are complete.
  size_t recvHeaderBytes = 0;
  std::function<void()> onHeader;
  // Payload bytes [begin, end) (offsets after the header) are complete; ranges are whole units.
  std::function<void(size_t begin, size_t end)> onReceived;
  size_t unit = 1;
  size_t grain = 256 * 1024;
  // onReceived also runs as soon as this much payload is in, however little is new: what is sent
  // next may wait on it (sendAvailable), and the peer may be waiting on that in turn.
  size_t flushAt = 0;
  // Relay (broadcast chain): the payload sent is the payload received, so sending may only run
  // sendHeaderBytes + (payload received so far) ahead.
  bool relay = false;
  size_t sendHeaderBytes = 0;
  // Otherwise, when set: how much of the payload after the send header may go, given how much
  // received payload onReceived has processed (a segment goes out as soon as it is reduced).
  std::function<size_t(size_t handedOn)> sendAvailable;
};

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
