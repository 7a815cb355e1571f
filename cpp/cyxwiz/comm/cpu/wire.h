// Everything that crosses a socket, as fixed-size little-endian records.
//
//   Hello       first 40 bytes of every connection: who is calling, for which job
//   HelloReply  the acceptor's answer: 0 = welcome, else a reason to go away
//   CallHeader  first 32 bytes of every collective on a ring link: what the sender is running
//   StoreFrame  16-byte header of a store request, a store reply, or a monitor notice
//   PeerHeader  first 24 bytes of every point-to-point message: its tag and length
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "cyxwiz/comm/types.h"

namespace cyxwiz::comm::wire {

constexpr char kHelloMagic[8] = {'C', 'Y', 'X', 'W', 'I', 'Z', 'R', 'V'};
constexpr uint32_t kProtocolVersion = 2;  // 2: mutual challenge-response with a secret
constexpr uint32_t kCallMagic = 0x4c435843;  // "CXCL"
constexpr size_t kHelloBytes = 40;
constexpr size_t kCallHeaderBytes = 32;
constexpr size_t kFrameBytes = 16;
constexpr uint32_t kPeerMagic = 0x4d505843;  // "CXPM"
constexpr size_t kPeerHeaderBytes = 24;
constexpr size_t kMaxReasonBytes = 4096;
// Caps on lengths a rank reads from rank 0 before it allocates. A pycyxwiz master never sends more
// (the store refuses larger values, an error reply is a reason, a notice is one rank's message plus
// a verdict), so a larger length means the peer is not one: it is refused before a byte is allocated.
constexpr uint64_t kMaxStoreValueBytes = 16ull << 20;
constexpr uint64_t kMaxNoticeBytes = 1ull << 20;
// With a shared secret, the hello is followed by the caller's nonce and a challenge-response
// (handshake.h).
constexpr uint16_t kHelloHasProof = 1;
// A ring link between hosts (the hierarchical all-reduce's), not the world ring's: two ranks may
// hold both kinds of link to each other.
constexpr uint16_t kHelloHostLink = 2;

enum class Channel : uint16_t { Store = 1, Monitor = 2, Ring = 3 };
const char* channelName(Channel c);

struct Hello {
  uint32_t version = kProtocolVersion;
  Channel channel = Channel::Store;
  uint16_t flags = 0;
  uint64_t jobHash = 0;
  uint32_t worldSize = 0;
  uint32_t rank = 0;
  uint32_t generation = 0;  // which init() of this process: a re-init must not join the last one's rendezvous
};

void encodeHello(const Hello& h, uint8_t out[kHelloBytes]);
// False when the bytes are not a pycyxwiz hello (wrong magic): a stranger on the port.
bool decodeHello(const uint8_t in[kHelloBytes], Hello* h);

void encodeCall(const CallSignature& c, uint8_t out[kCallHeaderBytes]);
// False on a wrong magic: the byte stream is out of step (a bug, or a peer from another version).
bool decodeCall(const uint8_t in[kCallHeaderBytes], CallSignature* c);

// A point-to-point message (p2p.h) on a link from its sender; `bytes` of payload follow.
struct PeerHeader {
  int64_t tag = 0;
  uint64_t bytes = 0;
};
void encodePeer(const PeerHeader& h, uint8_t out[kPeerHeaderBytes]);
// False on a wrong magic: the peer is not a pycyxwiz rank, or the stream is out of step.
bool decodePeer(const uint8_t in[kPeerHeaderBytes], PeerHeader* h);

enum class StoreOp : uint8_t {
  Set = 1,      // key, value -> ok
  Get = 2,      // key -> value, once some rank has set it (the reply waits)
  Check = 3,    // key -> "1" / "0" at once
  Add = 4,      // key, decimal delta -> decimal new value
  Abort = 5,    // monitor: value = error kind byte + message; told to every other rank
  Goodbye = 6,  // monitor: this rank finalized on purpose; its disconnect is not a failure
};

enum class Notice : uint8_t { Abort = 1, Shutdown = 2 };
enum class ErrorKind : uint8_t { Network = 1, Timeout = 2, Backend = 3 };

struct Frame {
  uint8_t type = 0;      // StoreOp for requests, 0/1 status for replies, Notice for monitor notices
  uint8_t kind = 0;      // ErrorKind in an abort notice
  uint32_t word = 0;     // key length in requests, origin rank in notices
  uint64_t length = 0;   // value / message length
};

void encodeFrame(const Frame& f, uint8_t out[kFrameBytes]);
Frame decodeFrame(const uint8_t in[kFrameBytes]);

// FNV-1a of the job id: ranks compare it in the hello without sending the id itself.
uint64_t hashJobId(const std::string& jobId);

}  // namespace cyxwiz::comm::wire
