// Window: memory every member of a group can read. Each member writes its own half, then all
// arrive, then each reads the others' halves. It lets an algorithm (window_collectives.h) read its
// peers' memory directly, with no copy through a transport, without knowing how that memory is
// shared (a segment in /dev/shm here, mapped GPU memory elsewhere) or how a member waits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cyxwiz::comm {

class Window {
 public:
  virtual ~Window() = default;

  virtual int size() const = 0;
  virtual int me() const = 0;
  // The job rank of `member`: for messages, and for where its data goes in a gathered array.
  virtual int rank(int member) const = 0;
  virtual int memberOf(int jobRank) const = 0;  // -1 when not a member
  // The most bytes a member's half holds, so one round carries.
  virtual size_t halfBytes() const = 0;

  // The half the next round writes. Rounds alternate halves, so a member writes one while its peers
  // may still read the other.
  virtual int nextHalf() = 0;
  // This member's half h, once every peer has finished reading what it last held; its data placed
  // for fast copies to and from `like`.
  virtual uint8_t* writable(int h, const void* like) = 0;
  // Publish the next phase and wait until every member has. The first arrival of a call also
  // checks every member's call header, and raises on a mismatch.
  virtual void arrive() = 0;
  // Member `member`'s half h of the current round.
  virtual const uint8_t* half(int member, int h) const = 0;
  // This member has read the peers' half h of the current round.
  virtual void doneReading(int h) = 0;
  // Member `member`'s copy of shared buffer `buffer` (CallSignature::buffer) as mapped here, or null
  // when there is none: then the data must travel through the halves.
  virtual const uint8_t* shared(int member, uint32_t buffer) const = 0;
};

}  // namespace cyxwiz::comm
