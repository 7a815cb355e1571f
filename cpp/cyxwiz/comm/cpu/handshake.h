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
};

// The two halves of sayHello, for ring links: every rank sends its hello to the right, then answers
// the one from its left, then reads its own answer, so no rank waits on a circle of others.
bool sendHello(const Socket& s, const wire::Hello& hello, Deadline deadline);
std::string awaitHelloReply(const Socket& s, Deadline deadline);

// Sends the hello and waits for the answer. Returns "" when welcomed, else the acceptor's reason
// (or what went wrong on the wire, starting with "no answer").
std::string sayHello(const Socket& s, const wire::Hello& hello, Deadline deadline);

// Checks a received hello. Returns "" when acceptable, else a reason for the caller and the log.
std::string checkHello(const wire::Hello& got, wire::Channel expected, const JobIdentity& job);

// Answers a hello (best effort: the caller may already be gone).
void replyHello(const Socket& s, const std::string& refusal, Deadline deadline);

// Printable prefix of what a stranger sent: "'GET / HTTP/1.1'" or "16 bytes 00 ff ...".
std::string describeStrangerBytes(const uint8_t* data, size_t n);

}  // namespace cyxwiz::comm
