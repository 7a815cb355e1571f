#include "cyxwiz/comm/types.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Avg: return "AVG";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Product: return "PRODUCT";
  }
  return "unknown op";
}

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Barrier: return "barrier";
  }
  return "unknown collective";
}

std::string CallSignature::describe() const {
  std::string s = makeString(collectiveName(collective), " #", sequence);
  if (collective == Collective::Barrier) return s;
  s += makeString(" (", dtypeName(dtype), ", ", count, count == 1 ? " element" : " elements");
  if (collective == Collective::AllReduce || collective == Collective::ReduceScatter) s += makeString(", ", reduceOpName(op));
  if (collective == Collective::Broadcast) s += makeString(", src ", root);
  return s + ")";
}

}  // namespace cyxwiz::comm
