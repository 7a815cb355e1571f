// Group: the ranks of one host and the segment they share, with the protocol state that lasts from
// one collective to the next.
//
// Layout: a header (magic, the creator's token, the geometry); one control block per rank; then one
// slot per rank, in two halves, that only its owner writes. Collectives advance in rounds: a rank
// writes its half, publishes its next phase (its round count), waits until every peer has published
// the same phase, then reads the peers' halves. Rounds alternate halves, so a rank writes one half
// while its peers may still read the other; before it writes a half again it checks that every peer
// has published the phase that follows its last reading of that half (almost always true already).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cyxwiz/comm/call_header.h"
#include "cyxwiz/comm/shm/buffers.h"
#include "cyxwiz/comm/shm/segment.h"

namespace cyxwiz::comm::shm {

// One rank's flags: the phase it has published (a futex word), how many peers sleep on it, its pid,
// whether it has left (finalized or exiting: a peer waiting for it stops at once), and the header of its current call by sequence parity (a peer reads it in the call's first round,
// and no rank can be two calls ahead of another).
struct alignas(64) Control {
  std::atomic<uint32_t> phase;
  std::atomic<uint32_t> sleepers;
  int32_t pid;
  std::atomic<uint32_t> left;
  uint32_t offset[2];  // where the data of half h starts in it (set by its owner before publishing)
  uint8_t pad[40];
  uint8_t header[2][kCallHeaderBytes];
};
static_assert(sizeof(Control) == 128, "one control block: two cache lines");

class Group {
 public:
  static constexpr uint64_t kMagic = 0x3130304d48535843ull;  // "CXSHM001"
  static constexpr size_t kTokenBytes = 32;

  static size_t segmentBytes(int ranks, size_t halfBytes);
  // The creator writes the geometry and its token into a fresh (zeroed) segment.
  static void format(const Segment& segment, int ranks, size_t halfBytes, const std::string& token);
  // An attacher's proof that it mapped the creator's segment: empty when it did, else why not.
  static std::string verify(const Segment& segment, int ranks, size_t halfBytes, const std::string& token);

  // ranks: the job ranks of the group, by local index; me: this rank's local index.
  Group(Segment segment, std::vector<int> ranks, int me, size_t halfBytes);

  int size() const { return static_cast<int>(ranks_.size()); }
  int me() const { return me_; }
  int rank(int local) const { return ranks_[static_cast<size_t>(local)]; }
  int localOf(int rank) const;  // -1 when not in the group
  size_t halfBytes() const { return halfBytes_; }
  Control& control(int local) const;
  // The data of rank `local`'s half h, at the offset its owner chose for what it holds now.
  uint8_t* half(int local, int h) const { return halfBase(local, h) + control(local).offset[h]; }
  // This rank's half h, its data placed like `like` (see alignedOffset), for writing.
  uint8_t* place(int h, const void* like);
  uint8_t* halfBase(int local, int h) const;
  Segment& segment() { return segment_; }
  // "rank 1 (127.0.0.1:41234, pid 4242, same host)": its ring address, for the logs that name it so.
  std::string peerName(int local) const;
  // This rank finalizes or exits: peers waiting for it wake and fail, naming it.
  void leave();
  // Dead or a zombie (only where pids mean something here: checkPids).
  bool peerGone(int local) const;
  std::vector<std::string> addresses;  // by job rank, when known

  // Protocol state (used by shm::Window, window.h, one collective at a time).
  uint32_t phase = 0;                 // the last phase this rank published
  uint32_t readDone[2] = {0, 0};      // every peer at this phase has finished reading my half h
  uint64_t rounds = 0;                // round r writes half r & 1
  bool checkPids = false;             // the peers' pids mean something here (same pid namespace)
  SharedBuffers buffers;              // made by sharedZeros, read by all_reduce

 private:
  Segment segment_;
  std::vector<int> ranks_;
  int me_;
  size_t halfBytes_;
  size_t controlAt_, slotsAt_;
};

}  // namespace cyxwiz::comm::shm
