// Small blocking exchanges DDP and the trainer build from the backend's collectives: strings,
// byte blobs and a few numbers. Every rank must call them in the same order (they are collectives).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cyxwiz/comm/backend.h"

namespace cyxwiz::ddp {

// Every rank's string, indexed by rank.
std::vector<std::string> allGatherStrings(comm::Backend& backend, const std::string& mine);
// `src`'s bytes on every rank (the others' `bytes` are ignored).
std::vector<uint8_t> broadcastBytes(comm::Backend& backend, const std::vector<uint8_t>& bytes, int src);
// Element-wise sums over the ranks, in float64.
std::vector<double> allReduceSum(comm::Backend& backend, std::vector<double> values);
// Every rank's values (all ranks pass the same count), rank-major.
std::vector<double> allGatherDoubles(comm::Backend& backend, const std::vector<double>& mine);

}  // namespace cyxwiz::ddp
