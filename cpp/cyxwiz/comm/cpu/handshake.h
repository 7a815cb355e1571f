// The first exchange on every connection. The caller sends a Hello; the acceptor checks it against
// its own job (magic, protocol version, job id hash, world size, rank range) and answers with
// welcome or a reason. A stranger (a port scanner, an HTTP request, another job) is refused and
// logged by the acceptor; it never disturbs the job.
#pragma once

#include <string>
#include <vector>

#include "cyxwiz/comm/cpu/socket.h"
#include "cyxwiz/comm/cpu/wire.h"

namespace cyxwiz::comm {

// What this process expects of the peers that call it.
struct JobIdentity {
  uint64_t jobHash = 0;
  int worldSize = 1;
  int rank = 0;
  std::string secret;  // CYXWIZ_SECRET; empty: peers need not prove anything
  uint32_t generation = 0;
};

// The acceptor's answer to a hello.
struct HelloAnswer {
  enum Kind { Welcome, Refused, Later, NoAnswer } kind = NoAnswer;
  std::string reason;
};

// The two halves of sayHello, for ring links: every rank sends its hello to the right, then answers
// the one from its left, then reads its own answer, so no rank waits on a circle of others.
// With a non-empty secret the hello carries a proof (a fresh nonce and an HMAC of hello + nonce
// under the secret): the secret itself never crosses the wire.
bool sendHello(const Socket& s, wire::Hello hello, const std::string& secret, Deadline deadline);
HelloAnswer awaitHelloReply(const Socket& s, Deadline deadline);

// Sends the hello and waits for the answer.
HelloAnswer sayHello(const Socket& s, const wire::Hello& hello, const std::string& secret, Deadline deadline);

// Checks a received hello. Returns "" when acceptable, else a reason for the caller and the log.
std::string checkHello(const wire::Hello& got, wire::Channel expected, const JobIdentity& job);

// Checks the proof that follows a hello with kHelloHasProof (`proof` null when there is none).
// Returns "" when this rank's secret and the caller's agree.
std::string checkProof(const uint8_t helloBytes[wire::kHelloBytes], const wire::Hello& hello, const uint8_t* proof,
                       const std::string& secret);

// Answers a hello (best effort: the caller may already be gone). `later`: not refused for good,
// the caller should try again (it reached the rendezvous of this rank's previous init()).
void replyHello(const Socket& s, const std::string& refusal, Deadline deadline, bool later = false);
std::vector<uint8_t> encodeHelloReply(const std::string& refusal, bool later);
// "" when the caller is on the same init() as this rank, else why it should come back later.
std::string checkGeneration(const wire::Hello& got, const JobIdentity& job);

// Printable prefix of what a stranger sent: "'GET / HTTP/1.1'" or "16 bytes 00 ff ...".
std::string describeStrangerBytes(const uint8_t* data, size_t n);

}  // namespace cyxwiz::comm
