// Names shared by every backend: reduction ops, collective kinds, and how to describe a call in a
// message ("all_reduce #12 (float32, 1000 elements, SUM)").
#pragma once

#include <cstdint>
#include <string>

#include "cyxwiz/tensor/dtype.h"

namespace cyxwiz::comm {

enum class ReduceOp : uint8_t { Sum = 0, Avg = 1, Max = 2, Min = 3, Product = 4 };
enum class Collective : uint8_t {
  AllReduce = 1, Broadcast = 2, AllGather = 3, ReduceScatter = 4, Barrier = 5,
  // Point-to-point (not collectives: only the two ranks take part; numbered on their own).
  Send = 6, Recv = 7,
  // Collectives whose messages travel over point-to-point links (cpu/peer_collectives.cpp).
  Gather = 8, Scatter = 9, AllToAll = 10,
  // Makes a buffer in memory every rank of a host maps (Backend::sharedZeros).
  ShareBuffer = 11,
  // The halves of an all-reduce, in place on one buffer (DDP's sharded optimizer step).
  ReduceScatterInPlace = 12, AllGatherInPlace = 13,
  // The 16-bit gradient exchange of a float32 shared buffer, rounded on the fly (Collectives::
  // allReduceRounded); the signature's dtype is the 16-bit type.
  AllReduceRounded = 14, ReduceScatterRounded = 15,
  // A reduction of a float32 shared buffer handed piece by piece to DDP's optimizer step (Collectives::
  // reduceForStep): every rank's whole reduction, or this rank's part.
  AllReduceForStep = 16, ReduceScatterForStep = 17
};

// The peer of a recv that takes a message from whichever rank sends first.
constexpr uint32_t kAnySource = 0xffffffffu;

const char* reduceOpName(ReduceOp op);
const char* collectiveName(Collective c);

// What one rank asked for; every rank of a collective must ask for the same thing.
struct CallSignature {
  Collective collective = Collective::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::Float32;
  uint64_t count = 0;    // elements this rank contributes
  uint32_t root = 0;     // broadcast source; the peer of a send/recv (kAnySource); 0 otherwise
  int64_t tag = 0;       // send/recv only (not on the wire of a collective)
  uint64_t sequence = 0; // position in this rank's issue order, from 1
  // The shared buffer (Backend::sharedZeros) the call covers whole, numbered in the order the ranks
  // made them; 0: private memory. Peers then read the data where it is (window_collectives.h).
  uint32_t buffer = 0;

  bool operator==(const CallSignature& o) const {
    return collective == o.collective && op == o.op && dtype == o.dtype && count == o.count && root == o.root &&
           sequence == o.sequence && buffer == o.buffer;
  }
  bool operator!=(const CallSignature& o) const { return !(*this == o); }
  std::string describe() const;
};

}  // namespace cyxwiz::comm
