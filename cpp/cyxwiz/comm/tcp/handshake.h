// The first exchange on every connection. The caller sends a Hello; the acceptor checks it against
// its own job (magic, protocol version, job id hash, world size, rank range) and answers with
// welcome or a reason. A stranger (a port scanner, an HTTP request, another job) is refused and
// logged by the acceptor; it never disturbs the job.
//
// With a shared secret (CYXWIZ_SECRET) the exchange is a mutual challenge-response:
//   caller   -> hello (flag kHelloHasProof) + nonceC (32 random bytes)
//   acceptor -> status 3 (challenge), 64: nonceS (32 random bytes) + HMAC(secret, "A", hello, nonceC, nonceS, acceptor rank)
//   caller   -> HMAC(secret, "C", hello, nonceC, nonceS, acceptor rank)      (only once the acceptor's proof is right)
//   acceptor -> status 0 (welcome) or a reason
// Each side proves the secret over a nonce the other side just chose, so a recorded exchange is
// worth nothing later, and neither side's proof can be reflected as the other's. The secret itself
// never crosses the wire; the traffic is not encrypted.
#pragma once

#include <string>
#include <vector>

#include "cyxwiz/comm/tcp/socket.h"
#include "cyxwiz/comm/tcp/wire.h"

namespace cyxwiz::comm::tcp {

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

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;

// The caller's side, one message at a time: send opening(), then read exactly need() bytes and
// feed() them, sending what feed() returns, until done(). It never reads past the handshake, so
// bytes the acceptor sends right after its welcome stay in the socket.
class CallerHello {
 public:
  // `acceptorRank`: whom the caller means to reach (0 for the rendezvous); its proof must name it.
  CallerHello(const wire::Hello& hello, const std::string& secret, int acceptorRank);
  const std::vector<uint8_t>& opening() const { return opening_; }
  size_t need() const { return need_; }
  std::vector<uint8_t> feed(const uint8_t* data);
  bool done() const { return need_ == 0; }
  const HelloAnswer& answer() const { return answer_; }

 private:
  void finish(HelloAnswer::Kind kind, std::string reason);

  std::string secret_;
  int acceptorRank_;
  std::vector<uint8_t> opening_;
  enum Step { Head, Reason, Challenge } step_ = Head;
  HelloAnswer::Kind refusalKind_ = HelloAnswer::Refused;
  bool proven_ = false;  // the acceptor proved the secret
  size_t need_ = 8;
  HelloAnswer answer_;
};

// Sends the hello and drives CallerHello to its end on a blocking socket (the rendezvous: rank 0).
HelloAnswer sayHello(const Socket& s, const wire::Hello& hello, const std::string& secret, Deadline deadline);

// The acceptor's side, fed bytes as they arrive. feed() consumes what the handshake needs and
// leaves the rest (requests pipelined after it) to the caller.
class AcceptorHello {
 public:
  enum Stage {
    Reading,   // waiting for more bytes
    Stranger,  // not a pycyxwiz hello: close without an answer
    Refused,   // an answer with the reason is in `out`: send it, then close
    Proven     // the hello is acceptable and the secret proven: the owner decides with finish()
  };
  // `ringPort`: only ring links may call; otherwise store and monitor connections.
  AcceptorHello(const JobIdentity& job, bool ringPort) : job_(job), ringPort_(ringPort) {}

  size_t feed(const uint8_t* data, size_t n, std::vector<uint8_t>* out);
  Stage stage() const { return stage_; }
  const wire::Hello& hello() const { return hello_; }
  bool helloRead() const { return helloRead_; }
  bool challenged() const { return challenged_; }
  const std::string& reason() const { return reason_; }
  // The final answer to a Proven caller: welcome when `refusal` is empty.
  void finish(const std::string& refusal, bool later, std::vector<uint8_t>* out);

 private:
  size_t readHello(const uint8_t* data, size_t n, std::vector<uint8_t>* out);
  void refuse(std::string reason, std::vector<uint8_t>* out);

  JobIdentity job_;
  bool ringPort_;
  Stage stage_ = Reading;
  bool helloRead_ = false, challenged_ = false;
  wire::Hello hello_;
  uint8_t helloBytes_[wire::kHelloBytes] = {};
  uint8_t nonces_[2 * kNonceBytes] = {};  // the caller's, then ours
  std::string reason_;
};

// Checks a received hello. Returns "" when acceptable, else a reason for the caller and the log.
std::string checkHello(const wire::Hello& got, wire::Channel expected, const JobIdentity& job);

std::vector<uint8_t> encodeHelloReply(const std::string& refusal, bool later);
// "" when the caller is on the same init() as this rank, else why it should come back later.
std::string checkGeneration(const wire::Hello& got, const JobIdentity& job);

// Printable prefix of what a stranger sent: "'GET / HTTP/1.1'" or "16 bytes 00 ff ...".
std::string describeStrangerBytes(const uint8_t* data, size_t n);

}  // namespace cyxwiz::comm::tcp
