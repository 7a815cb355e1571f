#include "cyxwiz/comm/tcp/handshake.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/sha256.h"
#include "cyxwiz/platform/random.h"

namespace cyxwiz::comm::tcp {

namespace {

constexpr char kProofLabel[] = "pycyxwiz handshake v2";
constexpr uint32_t kWelcome = 0, kRefused = 1, kLater = 2, kChallenge = 3;

void randomBytes(uint8_t* out, size_t n) {
  try {
    platform::randomBytes(out, n);  // needs no descriptor: works while a connection flood holds them all
  } catch (const Error& e) {
    throw NetworkError(makeString("init: no random bytes for the handshake: ", e.what()));
  }
}

// role 'A' (acceptor) or 'C' (caller): one side's proof is never the other's.
Digest proofMac(const std::string& secret, char role, const uint8_t* helloBytes, const uint8_t* nonces, int acceptorRank) {
  std::vector<uint8_t> msg(kProofLabel, kProofLabel + sizeof kProofLabel);
  msg.push_back(static_cast<uint8_t>(role));
  msg.insert(msg.end(), helloBytes, helloBytes + wire::kHelloBytes);
  msg.insert(msg.end(), nonces, nonces + 2 * kNonceBytes);
  uint32_t rank = static_cast<uint32_t>(acceptorRank);
  uint8_t r[4];
  std::memcpy(r, &rank, 4);
  msg.insert(msg.end(), r, r + 4);
  return hmacSha256(secret, msg.data(), msg.size());
}

uint32_t word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

CallerHello::CallerHello(const wire::Hello& hello, const std::string& secret, int acceptorRank)
    : secret_(secret), acceptorRank_(acceptorRank), opening_(wire::kHelloBytes) {
  wire::Hello h = hello;
  if (!secret.empty()) h.flags |= wire::kHelloHasProof;
  wire::encodeHello(h, opening_.data());
  if (!secret.empty()) {
    opening_.resize(wire::kHelloBytes + kNonceBytes);
    randomBytes(opening_.data() + wire::kHelloBytes, kNonceBytes);
  }
}

void CallerHello::finish(HelloAnswer::Kind kind, std::string reason) {
  answer_ = {kind, std::move(reason)};
  need_ = 0;
}

std::vector<uint8_t> CallerHello::feed(const uint8_t* data) {
  if (step_ == Reason) {
    finish(refusalKind_, std::string(reinterpret_cast<const char*>(data), need_));
    return {};
  }
  if (step_ == Challenge) {
    // data: nonceS + the acceptor's proof over both nonces.
    uint8_t nonces[2 * kNonceBytes];
    std::memcpy(nonces, opening_.data() + wire::kHelloBytes, kNonceBytes);
    std::memcpy(nonces + kNonceBytes, data, kNonceBytes);
    Digest expected = proofMac(secret_, 'A', opening_.data(), nonces, acceptorRank_);
    if (!digestsEqual(expected.data(), data + kNonceBytes, kMacBytes)) {
      finish(HelloAnswer::Refused, "this rank refused it in turn: its proof of the shared secret is wrong (CYXWIZ_SECRET "
                                   "differs between ranks, or another program answers on this port)");
      return {};
    }
    proven_ = true;
    step_ = Head;
    need_ = 8;
    Digest mine = proofMac(secret_, 'C', opening_.data(), nonces, acceptorRank_);
    return std::vector<uint8_t>(mine.begin(), mine.end());
  }
  uint32_t status = word(data), length = word(data + 4);
  if (status == kWelcome && length == 0) {
    if (!secret_.empty() && !proven_) {
      finish(HelloAnswer::Refused, "this rank refused it in turn: it welcomed this rank without proving the shared "
                                   "secret (CYXWIZ_SECRET): another program answers on this port, or it runs a pycyxwiz "
                                   "without the secret");
    } else {
      finish(HelloAnswer::Welcome, "");
    }
  } else if (status == kChallenge && !secret_.empty() && !proven_ && length == kNonceBytes + kMacBytes) {
    step_ = Challenge;
    need_ = length;
  } else if ((status == kRefused || status == kLater) && length <= wire::kMaxReasonBytes) {
    refusalKind_ = status == kLater ? HelloAnswer::Later : HelloAnswer::Refused;
    if (length == 0) finish(refusalKind_, "refused");
    step_ = Reason;
    need_ = length;
  } else {
    finish(HelloAnswer::Refused, makeString("this rank refused it in turn: a malformed answer to the hello (status ",
                                            status, ", length ", length, "): not a pycyxwiz peer of this version"));
  }
  return {};
}

HelloAnswer sayHello(const Socket& s, const wire::Hello& hello, const std::string& secret, Deadline deadline) {
  CallerHello caller(hello, secret, 0);
  IoStatus st = s.sendAll(caller.opening().data(), caller.opening().size(), deadline);
  if (!st.ok()) return {HelloAnswer::NoAnswer, "no answer: sending the hello failed: " + st.describe()};
  std::vector<uint8_t> in;
  while (!caller.done()) {
    in.resize(caller.need());
    st = s.recvAll(in.data(), in.size(), deadline);
    if (!st.ok()) return {HelloAnswer::NoAnswer, "no answer to the hello: " + st.describe()};
    std::vector<uint8_t> out = caller.feed(in.data());
    if (!out.empty() && !(st = s.sendAll(out.data(), out.size(), deadline)).ok()) {
      return {HelloAnswer::NoAnswer, "no answer: sending the proof failed: " + st.describe()};
    }
  }
  return caller.answer();
}

void AcceptorHello::refuse(std::string reason, std::vector<uint8_t>* out) {
  reason_ = std::move(reason);
  stage_ = Refused;
  std::vector<uint8_t> reply = encodeHelloReply(reason_, false);
  out->insert(out->end(), reply.begin(), reply.end());
}

size_t AcceptorHello::readHello(const uint8_t* data, size_t n, std::vector<uint8_t>* out) {
  size_t have = n < 8 ? n : 8;
  if (std::memcmp(data, wire::kHelloMagic, have) != 0) {
    stage_ = Stranger;
    reason_ = makeString("not a pycyxwiz peer (it sent ", describeStrangerBytes(data, n), ")");
    return 0;
  }
  if (n < wire::kHelloBytes) return 0;
  wire::decodeHello(data, &hello_);
  bool proves = (hello_.flags & wire::kHelloHasProof) != 0;
  size_t length = wire::kHelloBytes + (proves ? kNonceBytes : 0);
  // An older version's hello differs past the version field: answer by the version alone.
  if (hello_.version != wire::kProtocolVersion) length = wire::kHelloBytes;
  if (n < length) return 0;
  helloRead_ = true;
  std::memcpy(helloBytes_, data, wire::kHelloBytes);
  wire::Channel expected = ringPort_ ? wire::Channel::Ring
                           : hello_.channel == wire::Channel::Monitor ? wire::Channel::Monitor : wire::Channel::Store;
  std::string refusal = checkHello(hello_, expected, job_);
  if (refusal.empty() && job_.secret.empty() && proves) {
    refusal = "it proves a shared secret (CYXWIZ_SECRET) but this rank has none: set the same CYXWIZ_SECRET on every rank";
  }
  if (refusal.empty() && !job_.secret.empty() && !proves) {
    refusal = "it does not prove the job's shared secret: set the same CYXWIZ_SECRET on every rank";
  }
  if (!refusal.empty()) {
    refuse(refusal, out);
    return length;
  }
  if (!proves) {
    stage_ = Proven;
    return length;
  }
  std::memcpy(nonces_, data + wire::kHelloBytes, kNonceBytes);
  randomBytes(nonces_ + kNonceBytes, kNonceBytes);
  Digest mac = proofMac(job_.secret, 'A', helloBytes_, nonces_, job_.rank);
  std::vector<uint8_t> challenge = encodeHelloReply("", false);
  uint32_t head[2] = {kChallenge, static_cast<uint32_t>(kNonceBytes + kMacBytes)};
  std::memcpy(challenge.data(), head, 8);
  challenge.insert(challenge.end(), nonces_ + kNonceBytes, nonces_ + 2 * kNonceBytes);
  challenge.insert(challenge.end(), mac.begin(), mac.end());
  out->insert(out->end(), challenge.begin(), challenge.end());
  challenged_ = true;
  return length;
}

size_t AcceptorHello::feed(const uint8_t* data, size_t n, std::vector<uint8_t>* out) {
  if (stage_ != Reading) return 0;
  if (!helloRead_) return readHello(data, n, out);
  if (n < kMacBytes) return 0;
  Digest expected = proofMac(job_.secret, 'C', helloBytes_, nonces_, job_.rank);
  if (!digestsEqual(expected.data(), data, kMacBytes)) {
    refuse("its proof of the shared secret is wrong: CYXWIZ_SECRET differs between ranks", out);
  } else {
    stage_ = Proven;
  }
  return kMacBytes;
}

void AcceptorHello::finish(const std::string& refusal, bool later, std::vector<uint8_t>* out) {
  std::vector<uint8_t> reply = encodeHelloReply(refusal, later);
  out->insert(out->end(), reply.begin(), reply.end());
  if (!refusal.empty()) {
    stage_ = Refused;
    reason_ = refusal;
  }
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
  uint32_t status = reason.empty() ? kWelcome : later ? kLater : kRefused;
  uint32_t length = static_cast<uint32_t>(reason.size());
  std::memcpy(out.data(), &status, 4);
  std::memcpy(out.data() + 4, &length, 4);
  std::memcpy(out.data() + 8, reason.data(), reason.size());
  return out;
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

}  // namespace cyxwiz::comm::tcp
