#include "cyxwiz/comm/tcp/wire.h"

#include "cyxwiz/comm/record.h"

namespace cyxwiz::comm::tcp::wire {

using record::get;
using record::put;

const char* channelName(Channel c) {
  switch (c) {
    case Channel::Store: return "store";
    case Channel::Monitor: return "monitor";
    case Channel::Ring: return "ring link";
  }
  return "unknown channel";
}

void encodeHello(const Hello& h, uint8_t out[kHelloBytes]) {
  std::memset(out, 0, kHelloBytes);
  std::memcpy(out, kHelloMagic, 8);
  put<uint32_t>(out, 8, h.version);
  put<uint16_t>(out, 12, static_cast<uint16_t>(h.channel));
  put<uint16_t>(out, 14, h.flags);
  put<uint64_t>(out, 16, h.jobHash);
  put<uint32_t>(out, 24, h.worldSize);
  put<uint32_t>(out, 28, h.rank);
  put<uint32_t>(out, 32, h.generation);
}

bool decodeHello(const uint8_t in[kHelloBytes], Hello* h) {
  if (std::memcmp(in, kHelloMagic, 8) != 0) return false;
  h->version = get<uint32_t>(in, 8);
  h->channel = static_cast<Channel>(get<uint16_t>(in, 12));
  h->flags = get<uint16_t>(in, 14);
  h->jobHash = get<uint64_t>(in, 16);
  h->worldSize = get<uint32_t>(in, 24);
  h->rank = get<uint32_t>(in, 28);
  h->generation = get<uint32_t>(in, 32);
  return true;
}

void encodeFrame(const Frame& f, uint8_t out[kFrameBytes]) {
  std::memset(out, 0, kFrameBytes);
  out[0] = f.type;
  out[1] = f.kind;
  put<uint32_t>(out, 4, f.word);
  put<uint64_t>(out, 8, f.length);
}

Frame decodeFrame(const uint8_t in[kFrameBytes]) {
  Frame f;
  f.type = in[0];
  f.kind = in[1];
  f.word = get<uint32_t>(in, 4);
  f.length = get<uint64_t>(in, 8);
  return f;
}

void encodePeer(const PeerHeader& h, uint8_t out[kPeerHeaderBytes]) {
  std::memset(out, 0, kPeerHeaderBytes);
  put<uint32_t>(out, 0, kPeerMagic);
  put<int64_t>(out, 8, h.tag);
  put<uint64_t>(out, 16, h.bytes);
}

bool decodePeer(const uint8_t in[kPeerHeaderBytes], PeerHeader* h) {
  if (get<uint32_t>(in, 0) != kPeerMagic) return false;
  h->tag = get<int64_t>(in, 8);
  h->bytes = get<uint64_t>(in, 16);
  return true;
}

uint64_t hashJobId(const std::string& jobId) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : jobId) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace cyxwiz::comm::tcp::wire
