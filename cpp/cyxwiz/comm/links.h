// Links: how a pairwise algorithm (the ring, recursive doubling) moves bytes between the members of
// its group, whatever carries them. Members are numbered 0..size()-1 in the algorithm's order (the
// world's ranks, or one rank per host for the ring between hosts). A step sends to one member while
// it receives from another (the ring: right and left; recursive doubling: one partner both ways) and
// hands received bytes on in segments, so that reducing overlaps the rest of the transfer.
// tcp/links.h carries steps over sockets, shm/links.h through the host's shared segment; ring.h runs
// on either without knowing which.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cyxwiz/platform/net.h"

namespace cyxwiz::comm {

struct Step {
  std::vector<platform::IoVec> send;  // to the `to` member, in order
  std::vector<platform::IoVec> recv;  // from the `from` member, in order
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

class Links {
 public:
  virtual ~Links() = default;
  virtual int size() const = 0;
  virtual int me() const = 0;
  // The job rank of a linked member, for messages.
  virtual int rank(int member) const = 0;
  // Whether a step may take this member as `from` or `to` (the ring's neighbours always are).
  virtual bool linked(int member) const = 0;
  // Every member runs the same sequence of steps; a step ends when all its bytes have moved. Errors
  // (a lost peer, the timeout, another rank's failure) raise, naming the collective and the peer.
  virtual void run(Step& step, int from, int to) = 0;
  // The collective these links serve now, for messages.
  virtual std::string what() const = 0;
};

}  // namespace cyxwiz::comm
