// The Window (comm/window.h) of one host's ranks: their shared segment (group.h) and the round
// protocol over it, for one collective call.
//
// Waiting: spin on the peer's phase for the spin budget, then sleep on it as a futex in slices,
// between which the job monitor (a peer's failure or death), Ctrl-C, finalize() and the peer's pid
// are checked. A wait with no progress for the timeout fails naming the peer, as on TCP. The first
// round of every call compares the call headers of all ranks: a mismatch is an error naming the
// other rank's call, never wrong numbers.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/comm/monitor.h"
#include "cyxwiz/comm/shm/group.h"
#include "cyxwiz/comm/window.h"
#include "cyxwiz/comm/work.h"

namespace cyxwiz::comm::shm {

class Window final : public comm::Window {
 public:
  // As Duplex (tcp/duplex.h): `work` names the call in errors, `spin` bounds busy waiting,
  // `interrupted` (may be null) is asked between sleeps, `finalizing` says finalize() stopped us.
  Window(Group& group, const CallSignature& call, Monitor* monitor, int64_t timeoutMs, const Work& work,
         std::chrono::microseconds spin, bool (*interrupted)(), const std::atomic<bool>* finalizing);

  int size() const override { return g_.size(); }
  int me() const override { return g_.me(); }
  int rank(int member) const override { return g_.rank(member); }
  int memberOf(int jobRank) const override { return g_.localOf(jobRank); }
  size_t halfBytes() const override { return g_.halfBytes(); }
  int nextHalf() override { return static_cast<int>(g_.rounds++ & 1); }
  // Placed by Group::place.
  uint8_t* writable(int h, const void* like) override;
  void arrive() override;
  const uint8_t* half(int member, int h) const override { return g_.half(member, h); }
  void doneReading(int h) override { g_.readDone[h] = g_.phase + 1; }
  const uint8_t* shared(int member, uint32_t buffer) const override;
  // The call, for messages.
  std::string what() const { return work_.description(); }

 private:
  void publish();
  void waitAll(uint32_t phase);
  void waitFor(int peer, uint32_t phase);
  // Between sleeps: the monitor, Ctrl-C, finalize(), the peer's pid and the deadline.
  void checkWhileWaiting(int peer, uint32_t phase, Deadline deadline);
  void checkHeaders();

  Group& g_;
  CallSignature call_;
  Monitor* monitor_;
  int64_t timeoutMs_;
  const Work& work_;
  std::chrono::microseconds spin_;
  bool (*interrupted_)();
  const std::atomic<bool>* finalizing_;
  uint8_t myHeader_[kCallHeaderBytes];
  bool started_ = false;
};

}  // namespace cyxwiz::comm::shm
