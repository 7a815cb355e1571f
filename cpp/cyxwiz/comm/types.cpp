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
    case Collective::Send: return "send";
    case Collective::Recv: return "recv";
    case Collective::Gather: return "gather";
    case Collective::Scatter: return "scatter";
    case Collective::AllToAll: return "all_to_all";
    case Collective::ShareBuffer: return "share_buffer";
    case Collective::ReduceScatterInPlace: return "reduce_scatter (in place)";
    case Collective::AllGatherInPlace: return "all_gather (in place)";
    case Collective::AllReduceRounded: return "all_reduce (16-bit, rounded in place)";
    case Collective::ReduceScatterRounded: return "reduce_scatter (16-bit, rounded in place)";
    case Collective::AllReduceForStep: return "all_reduce (read by the optimizer step)";
    case Collective::ReduceScatterForStep: return "reduce_scatter (read by the optimizer step)";
  }
  return "unknown collective";
}

std::string CallSignature::describe() const {
  std::string s = makeString(collectiveName(collective), " #", sequence);
  if (collective == Collective::Barrier) return s;
  if (collective == Collective::Send) s += makeString(" to rank ", root);
  if (collective == Collective::Recv) s += root == kAnySource ? std::string(" from any rank") : makeString(" from rank ", root);
  if (collective == Collective::AllToAll) return s + makeString(" (", dtypeName(dtype), ")");  // counts differ by rank
  s += makeString(" (", dtypeName(dtype), ", ", count, count == 1 ? " element" : " elements");
  if (collective == Collective::AllReduce || collective == Collective::ReduceScatter ||
      collective == Collective::ReduceScatterInPlace || collective == Collective::AllReduceRounded ||
      collective == Collective::ReduceScatterRounded || collective == Collective::AllReduceForStep ||
      collective == Collective::ReduceScatterForStep) s += makeString(", ", reduceOpName(op));
  if (collective == Collective::Broadcast || collective == Collective::Scatter) s += makeString(", src ", root);
  if (collective == Collective::Gather) s += makeString(", dst ", root);
  if (collective == Collective::Send || collective == Collective::Recv) s += makeString(", tag ", tag);
  if (buffer != 0) s += makeString(", shared buffer ", buffer);
  return s + ")";
}

}  // namespace cyxwiz::comm
