#include "cyxwiz/comm/cpu/handshake.h"

#include <cctype>
#include <cstdio>
#include <random>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/sha256.h"

namespace cyxwiz::comm {

namespace {

constexpr char kProofLabel[] = "pycyxwiz hello proof v1";

Digest proofMac(const std::string& secret, const uint8_t* helloBytes, const uint8_t* nonce) {
  std::vector<uint8_t> msg(kProofLabel, kProofLabel + sizeof kProofLabel);
  msg.insert(msg.end(), helloBytes, helloBytes + wire::kHelloBytes);
  msg.insert(msg.end(), nonce, nonce + 16);
  return hmacSha256(secret, msg.data(), msg.size());
}

}  // namespace

bool sendHello(const Socket& s, wire::Hello hello, const std::string& secret, Deadline deadline) {
  uint8_t buf[wire::kHelloBytes + wire::kProofBytes];
  size_t n = wire::kHelloBytes;
  if (!secret.empty()) hello.flags |= wire::kHelloHasProof;
  wire::encodeHello(hello, buf);
  if (!secret.empty()) {
    std::random_device random;
    for (int i = 0; i < 16; i += 4) {
      uint32_t r = random();
      std::memcpy(buf + wire::kHelloBytes + i, &r, 4);
    }
    Digest mac = proofMac(secret, buf, buf + wire::kHelloBytes);
    std::memcpy(buf + wire::kHelloBytes + 16, mac.data(), mac.size());
    n += wire::kProofBytes;
  }
  return s.sendAll(buf, n, deadline).ok();
}

std::string checkProof(const uint8_t helloBytes[wire::kHelloBytes], const wire::Hello& hello, const uint8_t* proof,
                       const std::string& secret) {
  bool proves = (hello.flags & wire::kHelloHasProof) != 0 && proof != nullptr;
  if (secret.empty() && proves) {
    return "it proves a shared secret (CYXWIZ_SECRET) but this rank has none: set the same CYXWIZ_SECRET on every rank";
  }
  if (secret.empty()) return "";
  if (!proves) return "it does not prove the job's shared secret: set the same CYXWIZ_SECRET on every rank";
  Digest expected = proofMac(secret, helloBytes, proof);
  if (!digestsEqual(expected.data(), proof + 16, expected.size())) {
    return "its proof of the shared secret is wrong: CYXWIZ_SECRET differs between ranks";
  }
  return "";
}

HelloAnswer awaitHelloReply(const Socket& s, Deadline deadline) {
  uint8_t head[8];
  IoStatus st = s.recvAll(head, sizeof head, deadline);
  if (!st.ok()) return {HelloAnswer::NoAnswer, "no answer to the hello: " + st.describe()};
  uint32_t status, length;
  std::memcpy(&status, head, 4);
  std::memcpy(&length, head + 4, 4);
  if (status == 0) return {HelloAnswer::Welcome, ""};
  HelloAnswer::Kind kind = status == 2 ? HelloAnswer::Later : HelloAnswer::Refused;
  if (length > wire::kMaxReasonBytes) return {kind, "refused, with a malformed reason"};
  std::string reason(length, '\0');
  st = s.recvAll(reason.data(), length, deadline);
  if (!st.ok()) return {kind, "refused (reason lost: " + st.describe() + ")"};
  return {kind, reason.empty() ? "refused" : reason};
}

HelloAnswer sayHello(const Socket& s, const wire::Hello& hello, const std::string& secret, Deadline deadline) {
  if (!sendHello(s, hello, secret, deadline)) return {HelloAnswer::NoAnswer, "no answer: sending the hello failed"};
  return awaitHelloReply(s, deadline);
}

std::string checkHello(const wire::Hello& got, wire::Channel expected, const JobIdentity& job) {
  if (got.version != wire::kProtocolVersion) {
    return makeString("it speaks pycyxwiz protocol version ", got.version, ", this rank speaks version ",
                      wire::kProtocolVersion, ": run the same pycyxwiz version on every rank");
  }
  if (got.jobHash != job.jobHash) {
    return "it belongs to another job (its job id differs: CYXWIZ_JOB_ID / TORCHELASTIC_RUN_ID / SLURM_JOB_ID "
           "must be the same on every rank, or two jobs share MASTER_PORT)";
  }
  if (static_cast<int>(got.worldSize) != job.worldSize) {
    return makeString("it was started with world size ", got.worldSize, " but this job has world size ", job.worldSize,
                      ": set the same WORLD_SIZE on every rank");
  }
  if (got.rank >= got.worldSize) return makeString("it claims rank ", got.rank, ", outside 0..", job.worldSize - 1);
  if (got.channel != expected) {
    return makeString("it opened a ", wire::channelName(got.channel), " where a ", wire::channelName(expected), " was expected");
  }
  return "";
}

std::string checkGeneration(const wire::Hello& got, const JobIdentity& job) {
  if (got.generation == job.generation) return "";
  return makeString("it is on init() #", got.generation, " but this rank is on init() #", job.generation,
                    " (one of them has not finalized its previous run yet)");
}

std::vector<uint8_t> encodeHelloReply(const std::string& refusal, bool later) {
  std::string reason = refusal.substr(0, wire::kMaxReasonBytes);
  std::vector<uint8_t> out(8 + reason.size());
  uint32_t status = reason.empty() ? 0 : later ? 2 : 1;
  uint32_t length = static_cast<uint32_t>(reason.size());
  std::memcpy(out.data(), &status, 4);
  std::memcpy(out.data() + 4, &length, 4);
  std::memcpy(out.data() + 8, reason.data(), reason.size());
  return out;
}

void replyHello(const Socket& s, const std::string& refusal, Deadline deadline, bool later) {
  std::vector<uint8_t> out = encodeHelloReply(refusal, later);
  s.sendAll(out.data(), out.size(), deadline);
}

std::string describeStrangerBytes(const uint8_t* data, size_t n) {
  if (n == 0) return "nothing";
  size_t shown = n < 24 ? n : 24;
  bool printable = true;
  for (size_t i = 0; i < shown; ++i) {
    printable = printable && (std::isprint(data[i]) || data[i] == '\r' || data[i] == '\n');
  }
  std::string out;
  if (printable) {
    out = "'";
    for (size_t i = 0; i < shown; ++i) {
      if (data[i] == '\r') out += "\\r";
      else if (data[i] == '\n') out += "\\n";
      else out += static_cast<char>(data[i]);
    }
    out += n > shown ? "...'" : "'";
    return out;
  }
  out = makeString(n, " bytes");
  for (size_t i = 0; i < shown; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, " %02x", data[i]);
    out += hex;
  }
  return n > shown ? out + " ..." : out;
}

}  // namespace cyxwiz::comm
