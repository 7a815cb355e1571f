// Opening the ring: every rank publishes the address of its own listener in the store, waits until
// all ranks have done so, connects to rank r+1 and accepts rank r-1. Hellos are sent before any
// answer is awaited, so no rank waits on a circle of others.
#pragma once

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/cpu/pair.h"
#include "cyxwiz/comm/store.h"

namespace cyxwiz::comm {

struct RingLinks {
  Pair left;   // rank r-1 sends to us here
  Pair right;  // we send to rank r+1 here
};

// `localIp`: the address other ranks can reach this one on (the interface that reaches rank 0).
RingLinks connectRing(const DistributedConfig& config, Store& store, const std::string& localIp, Deadline deadline);

}  // namespace cyxwiz::comm
