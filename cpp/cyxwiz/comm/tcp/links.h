// The TCP links of a ring (links.h): each member of the group is reached through the pair that
// rendezvous opened to it. Ring neighbours have a link each way (a ring of two: two sockets to the
// same peer, one accepted and one dialed); recursive-doubling partners one for both ways.
#pragma once

#include <vector>

#include "cyxwiz/comm/links.h"
#include "cyxwiz/comm/tcp/duplex.h"

namespace cyxwiz::comm::tcp {

class Links : public comm::Links {
 public:
  // me, size: this rank's place in the ring and its length. left/right: the links to members me-1
  // and me+1; partners[k-1] (may be null or empty): to member me XOR 2^k, k >= 1. The rest as Duplex.
  Links(int me, int size, Pair* left, Pair* right, std::vector<Pair>* partners, Monitor* monitor, Deadline deadline,
        int64_t timeoutMs, const Work& work, std::chrono::microseconds spin, bool (*interrupted)(),
        const std::atomic<bool>* finalizing);

  int size() const override { return size_; }
  int me() const override { return me_; }
  int rank(int member) const override;
  bool linked(int member) const override;
  void run(Step& step, int from, int to) override;
  std::string what() const override { return io_.what(); }

 private:
  int mod(int i) const { return ((i % size_) + size_) % size_; }
  Pair* partner(int member) const;  // the recursive-doubling link to it, or null
  Pair* receivingFrom(int member) const;
  Pair* sendingTo(int member) const;

  int me_, size_;
  Pair* left_;
  Pair* right_;
  std::vector<Pair>* partners_;
  Duplex io_;
};

}  // namespace cyxwiz::comm::tcp
