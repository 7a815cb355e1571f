#include "cyxwiz/comm/tcp/links.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::tcp {

Links::Links(int me, int size, Pair* left, Pair* right, std::vector<Pair>* partners, Monitor* monitor,
             Deadline deadline, int64_t timeoutMs, const Work& work, std::chrono::microseconds spin,
             bool (*interrupted)(), const std::atomic<bool>* finalizing)
    : me_(me),
      size_(size),
      left_(left),
      right_(right),
      partners_(partners),
      io_(left, right, monitor, deadline, timeoutMs, work, spin, interrupted, finalizing) {}

Pair* Links::partner(int member) const {
  const int distance = me_ ^ member;
  if (partners_ == nullptr || distance < 2 || (distance & (distance - 1)) != 0) return nullptr;
  size_t k = 0;
  while ((2 << k) < distance) ++k;
  return k < partners_->size() ? &(*partners_)[k] : nullptr;
}

// A neighbour is reached through the link on its side; receiving prefers the left one and sending
// the right one, so that in a ring of two each socket carries one direction.
Pair* Links::receivingFrom(int member) const {
  if (member == mod(me_ - 1)) return left_;
  if (member == mod(me_ + 1)) return right_;
  return partner(member);
}

Pair* Links::sendingTo(int member) const {
  if (member == mod(me_ + 1)) return right_;
  if (member == mod(me_ - 1)) return left_;
  return partner(member);
}

bool Links::linked(int member) const { return member != me_ && receivingFrom(member) != nullptr; }

int Links::rank(int member) const {
  const Pair* p = receivingFrom(member);
  return p != nullptr ? p->rank : -1;
}

void Links::run(Step& step, int from, int to) {
  Pair* in = receivingFrom(from);
  Pair* out = sendingTo(to);
  if (in == nullptr || out == nullptr) {
    throw BackendError(makeString(what(), ": no TCP link from member ", from, " or to member ", to, " of ", size_,
                                  " (this is member ", me_, "): a collective asked for a link rendezvous did not open"));
  }
  io_.use(in, out);
  io_.run(step);
}

}  // namespace cyxwiz::comm::tcp
