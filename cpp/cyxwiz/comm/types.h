// Names shared by every backend: reduction ops, collective kinds, and how to describe a call in a
// message ("all_reduce #12 (float32, 1000 elements, SUM)").
#pragma once

#include <cstdint>
#include <string>

#include "cyxwiz/tensor/dtype.h"

namespace cyxwiz::comm {

enum class ReduceOp : uint8_t { Sum = 0, Avg = 1, Max = 2, Min = 3, Product = 4 };
enum class Collective : uint8_t { AllReduce = 1, Broadcast = 2, AllGather = 3, ReduceScatter = 4, Barrier = 5 };

const char* reduceOpName(ReduceOp op);
const char* collectiveName(Collective c);

// What one rank asked for; every rank of a collective must ask for the same thing.
struct CallSignature {
  Collective collective = Collective::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::Float32;
  uint64_t count = 0;    // elements this rank contributes
  uint32_t root = 0;     // broadcast source; 0 otherwise
  uint64_t sequence = 0; // position in this rank's issue order, from 1

  bool operator==(const CallSignature& o) const {
    return collective == o.collective && op == o.op && dtype == o.dtype && count == o.count && root == o.root &&
           sequence == o.sequence;
  }
  bool operator!=(const CallSignature& o) const { return !(*this == o); }
  std::string describe() const;
};

}  // namespace cyxwiz::comm
