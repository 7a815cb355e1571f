// Small blocking exchanges built from a backend's collectives: strings, byte blobs and a few numbers
// (DDP's checks, the trainer's metrics, the NCCL backend's GPU check). Every rank must call them in
// the same order (they are collectives).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cyxwiz/comm/backend.h"

namespace cyxwiz::comm {

// Every rank's string, indexed by rank.
std::vector<std::string> allGatherStrings(Backend& backend, const std::string& mine);
// `src`'s bytes on every rank (the others' `bytes` are ignored).
std::vector<uint8_t> broadcastBytes(Backend& backend, const std::vector<uint8_t>& bytes, int src);
// Element-wise sums over the ranks, in float64.
std::vector<double> allReduceSum(Backend& backend, std::vector<double> values);
// Every rank's values (all ranks pass the same count), rank-major.
std::vector<double> allGatherDoubles(Backend& backend, const std::vector<double>& mine);

}  // namespace cyxwiz::comm
