#include "cyxwiz/comm/cpu/rendezvous.h"

#include <algorithm>
#include <thread>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/comm/cpu/handshake.h"
#include "cyxwiz/comm/tcp_store.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm {

namespace {

std::string addressKey(int rank) { return makeString("cyxwiz/ring/addr/", rank); }

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

[[noreturn]] void missingRanks(const DistributedConfig& config, const std::vector<std::string>& missingKeys) {
  std::vector<int> missing;
  for (const auto& k : missingKeys) missing.push_back(std::stoi(k.substr(k.rfind('/') + 1)));
  throw TimeoutError(makeString(
      rankPrefix(), "init: Timeout waiting for peers: ", missing.size() == 1 ? "rank " : "ranks ", rankList(missing),
      " of ", config.worldSize, " did not join within ", config.timeoutMs, " ms. Start every rank with the same "
      "WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or raise DISTRIBUTED_TIMEOUT_MS if they start late"));
}

Pair dialRight(int rank, const std::string& address, Deadline deadline) {
  std::string host = address.substr(0, address.rfind(':'));
  int port = std::stoi(address.substr(address.rfind(':') + 1));
  int err = 0;
  for (;;) {
    Socket s = Socket::connectTo(host, port, deadline, &err);
    if (s.valid()) return Pair{std::move(s), rank, address};
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw NetworkError(makeString(rankPrefix(), "init: cannot connect to rank ", rank, " at ", address, ": ",
                                errnoString(err), " (a firewall between the machines, or rank ", rank,
                                " published an address this machine cannot reach)"));
}

// Accepts connections until rank `from` introduces itself; strangers are logged and dropped.
Pair acceptLeft(const DistributedConfig& config, const Socket& listener, const std::string& published, int from,
                Deadline deadline) {
  JobIdentity job = jobIdentityOf(config);
  while (Clock::now() < deadline) {
    throwIfInterrupted("init");
    Socket s = listener.accept(std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
    if (!s.valid()) continue;
    std::string peer = s.peerAddress();
    uint8_t buf[wire::kHelloBytes + wire::kProofBytes] = {};
    Deadline helloBy = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    IoStatus st = s.recvAll(buf, wire::kHelloBytes, helloBy);
    wire::Hello hello;
    if (!st.ok() || !wire::decodeHello(buf, &hello)) {
      logWarning(makeString("init: dropped a connection from ", peer, " to this rank's ring port: not a pycyxwiz peer (it sent ",
                            describeStrangerBytes(buf, st.done), ")"));
      continue;
    }
    bool hasProof = (hello.flags & wire::kHelloHasProof) != 0;
    if (hasProof && !s.recvAll(buf + wire::kHelloBytes, wire::kProofBytes, helloBy).ok()) continue;
    std::string refusal = checkHello(hello, wire::Channel::Ring, job);
    if (refusal.empty()) refusal = checkProof(buf, hello, hasProof ? buf + wire::kHelloBytes : nullptr, job.secret);
    if (refusal.empty()) refusal = checkGeneration(hello, job);
    if (refusal.empty() && static_cast<int>(hello.rank) != from) {
      refusal = makeString("it is rank ", hello.rank, " but this rank's left neighbour is rank ", from);
    }
    replyHello(s, refusal, helloBy);
    if (!refusal.empty()) {
      logWarning(makeString("init: refused a ring connection from ", peer, ": ", refusal));
      continue;
    }
    return Pair{std::move(s), from, peer};
  }
  throw TimeoutError(makeString(rankPrefix(), "init: Timeout waiting for peers: rank ", from,
                                " did not connect to this rank's published address ", published, " within ", config.timeoutMs,
                                " ms (a firewall may block the ports that ranks open for each other)"));
}

}  // namespace

RingLinks connectRing(const DistributedConfig& config, Store& store, const std::string& localIp, Deadline deadline) {
  const int rank = config.rank, n = config.worldSize;
  int err = 0;
  Socket listener = Socket::listenAny(0, 16, &err);
  if (!listener.valid()) throw NetworkError(makeString(rankPrefix(), "init: cannot open a listening socket: ", errnoString(err)));
  const std::string published = makeString(localIp, ":", listener.localPort());
  store.set(addressKey(rank), published, deadline);

  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(addressKey(r));
  std::vector<std::string> missing = store.waitAll(keys, deadline);
  if (!missing.empty()) missingRanks(config, missing);

  const int rightRank = (rank + 1) % n, leftRank = (rank + n - 1) % n;
  RingLinks links;
  links.right = dialRight(rightRank, store.get(addressKey(rightRank), deadline), deadline);
  wire::Hello hello;
  hello.channel = wire::Channel::Ring;
  hello.jobHash = wire::hashJobId(config.jobId);
  hello.worldSize = static_cast<uint32_t>(n);
  hello.rank = static_cast<uint32_t>(rank);
  hello.generation = config.generation;
  sendHello(links.right.socket, hello, config.secret, deadline);
  links.left = acceptLeft(config, listener, published, leftRank, deadline);
  HelloAnswer answer = awaitHelloReply(links.right.socket, deadline);
  if (answer.kind != HelloAnswer::Welcome) {
    throw NetworkError(makeString(rankPrefix(), "init: ", links.right.name(), " refused this rank's ring link: ", answer.reason));
  }
  return links;
}

}  // namespace cyxwiz::comm
