#include "cyxwiz/comm/call_header.h"

#include "cyxwiz/comm/record.h"

namespace cyxwiz::comm {

using record::get;
using record::put;

void encodeCall(const CallSignature& c, uint8_t out[kCallHeaderBytes]) {
  std::memset(out, 0, kCallHeaderBytes);
  put<uint32_t>(out, 0, kCallMagic);
  out[4] = static_cast<uint8_t>(c.collective);
  out[5] = static_cast<uint8_t>(c.op);
  out[6] = static_cast<uint8_t>(c.dtype);
  put<uint32_t>(out, 8, c.root);
  put<uint32_t>(out, 12, c.buffer);
  put<uint64_t>(out, 16, c.count);
  put<uint64_t>(out, 24, c.sequence);
}

bool decodeCall(const uint8_t in[kCallHeaderBytes], CallSignature* c) {
  if (get<uint32_t>(in, 0) != kCallMagic) return false;
  c->collective = static_cast<Collective>(in[4]);
  c->op = static_cast<ReduceOp>(in[5]);
  c->dtype = static_cast<DType>(in[6]);
  c->root = get<uint32_t>(in, 8);
  c->buffer = get<uint32_t>(in, 12);
  c->count = get<uint64_t>(in, 16);
  c->sequence = get<uint64_t>(in, 24);
  return true;
}

}  // namespace cyxwiz::comm
