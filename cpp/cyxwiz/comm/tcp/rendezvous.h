// Opening the ring: every rank publishes the address of its own listener (bound to that address
// only) in the store, waits until all ranks have done so, connects to rank r+1 (and to its higher
// butterfly partners) and accepts rank r-1 (and its lower partners). Hellos are sent before any
// answer is awaited and every handshake, dialed or accepted, advances under one poll, so no rank
// waits on a circle of others, and strangers on the port wait beside the real ranks (HelloGate).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/store.h"
#include "cyxwiz/comm/tcp/hello_gate.h"
#include "cyxwiz/comm/tcp/pair.h"

namespace cyxwiz::comm::tcp {

struct RingLinks {
  Pair left;   // rank r-1 sends to us here
  Pair right;  // we send to rank r+1 here
  // In power-of-two worlds of 4 or more: links to rank r XOR 2, r XOR 4, ... (r XOR 1 is a ring
  // neighbour), for recursive doubling of small messages: log2(N) rounds instead of N-1.
  std::vector<Pair> partners;
  // The ring between hosts of the ranks with this rank's local index (hierarchical all-reduce):
  // accepted from the previous host's counterpart, dialed to the next one's; empty when not asked.
  Pair hostLeft, hostRight;
  std::vector<Pair> hostPartners;  // as HostRing::partners
  // This rank's ring port, still open: point-to-point senders dial it after init (p2p.h).
  std::unique_ptr<HelloGate> gate;
  std::vector<std::string> addresses;  // every rank's published "ip:port", by rank
};

// Rank r XOR 2^k for k >= 1, in order; empty unless worldSize is a power of two >= 4.
std::vector<int> butterflyPartners(int rank, int worldSize);

// The ranks of this rank's ring between hosts, or -1 when there is none; with 4, 8, ... hosts also
// its butterfly partners there (the counterparts on host h XOR 2, h XOR 4, ...), in that order.
struct HostRing {
  int left = -1, right = -1;
  std::vector<int> partners;
};

// `localIp`: the address other ranks can reach this one on (the interface that reaches rank 0).
// `hostRing` (may be empty) is asked, once every rank has published its address, for this rank's
// ring between hosts.
RingLinks connectRing(const DistributedConfig& config, Store& store, const std::string& localIp, Deadline deadline,
                      const std::function<HostRing()>& hostRing = {});

}  // namespace cyxwiz::comm::tcp
