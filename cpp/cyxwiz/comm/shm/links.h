// The shared-memory links of a ring (links.h): a step through the host's segment (window.h), for
// the ring and recursive doubling on one host's ranks, no socket involved.
//
// A step runs in rounds of the window, every member together: each writes what it may send next
// (up to a half, after a small record) into its half, all arrive, each copies what its `from` wrote.
// The record says how many bytes follow, whom the writer receives from, and how much it still has to
// send and to receive; every member reads every record, so all agree on when the step is over
// without another round. Relays (broadcast) and sends that wait on reduced data (the ring's merged
// step) write only what is available, possibly nothing, in a round.
#pragma once

#include "cyxwiz/comm/links.h"
#include "cyxwiz/comm/shm/window.h"

namespace cyxwiz::comm::shm {

class Links : public comm::Links {
 public:
  explicit Links(Window& window) : w_(window) {}

  int size() const override { return w_.size(); }
  int me() const override { return w_.me(); }
  int rank(int member) const override { return w_.rank(member); }
  bool linked(int member) const override { return member != w_.me() && member >= 0 && member < w_.size(); }
  void run(Step& step, int from, int to) override;
  std::string what() const override { return w_.what(); }

 private:
  Window& w_;
};

}  // namespace cyxwiz::comm::shm
