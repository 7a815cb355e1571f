// The first exchange on every connection. The caller sends a Hello; the acceptor checks it against
// its own job (magic, protocol version, job id hash, world size, rank range) and answers with
// welcome or a reason. A stranger (a port scanner, an HTTP request, another job) is refused and
// logged by the acceptor; it never disturbs the job.
#pragma once

#include <string>

#include "cyxwiz/comm/cpu/socket.h"
#include "cyxwiz/comm/cpu/wire.h"

namespace cyxwiz::comm {

// What this process expects of the peers that call it.
struct JobIdentity {
  uint64_t jobHash = 0;
  int worldSize = 1;
  int rank = 0;
  std::string secret;  // CYXWIZ_SECRET; empty: peers need not prove anything
};

// The two halves of sayHello, for ring links: every rank sends its hello to the right, then answers
// the one from its left, then reads its own answer, so no rank waits on a circle of others.
// With a non-empty secret the hello carries a proof (a fresh nonce and an HMAC of hello + nonce
// under the secret): the secret itself never crosses the wire.
bool sendHello(const Socket& s, wire::Hello hello, const std::string& secret, Deadline deadline);
std::string awaitHelloReply(const Socket& s, Deadline deadline);

// Sends the hello and waits for the answer. Returns "" when welcomed, else the acceptor's reason
// (or what went wrong on the wire, starting with "no answer").
std::string sayHello(const Socket& s, const wire::Hello& hello, const std::string& secret, Deadline deadline);

// Checks a received hello. Returns "" when acceptable, else a reason for the caller and the log.
std::string checkHello(const wire::Hello& got, wire::Channel expected, const JobIdentity& job);

// Checks the proof that follows a hello with kHelloHasProof (`proof` null when there is none).
// Returns "" when this rank's secret and the caller's agree.
std::string checkProof(const uint8_t helloBytes[wire::kHelloBytes], const wire::Hello& hello, const uint8_t* proof,
                       const std::string& secret);

// Answers a hello (best effort: the caller may already be gone).
void replyHello(const Socket& s, const std::string& refusal, Deadline deadline);

// Printable prefix of what a stranger sent: "'GET / HTTP/1.1'" or "16 bytes 00 ff ...".
std::string describeStrangerBytes(const uint8_t* data, size_t n);

}  // namespace cyxwiz::comm
