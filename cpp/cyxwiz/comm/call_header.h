// The call header: the first 32 bytes of every collective, little-endian, saying what the sender is
// running (collective, op, dtype, root, shared buffer, count, sequence). Each transport carries it its
// own way (the ring's first step, ring.h; the shared segment's control block, shm/group.h) and the
// receiver compares it with its own call, so ranks that disagree get an error, never wrong numbers.
#pragma once

#include <cstdint>
#include <cstring>

#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm {

constexpr uint32_t kCallMagic = 0x4c435843;  // "CXCL"
constexpr size_t kCallHeaderBytes = 32;

void encodeCall(const CallSignature& c, uint8_t out[kCallHeaderBytes]);
// False on a wrong magic: the byte stream is out of step (a bug, or a peer from another version).
bool decodeCall(const uint8_t in[kCallHeaderBytes], CallSignature* c);

}  // namespace cyxwiz::comm
