#include "cyxwiz/comm/cpu/rendezvous.h"

#include <algorithm>
#include <map>
#include <set>
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

Pair dialPeer(int rank, const std::string& address, Deadline deadline) {
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

// Accepts connections until every rank in `expected` has introduced itself; strangers, other jobs
// and unexpected ranks are logged and dropped.
std::map<int, Pair> acceptPeers(const DistributedConfig& config, const Socket& listener, const std::string& published,
                                std::set<int> expected, Deadline deadline) {
  JobIdentity job = jobIdentityOf(config);
  std::map<int, Pair> accepted;
  while (!expected.empty() && Clock::now() < deadline) {
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
    if (refusal.empty() && expected.count(static_cast<int>(hello.rank)) == 0) {
      refusal = makeString("it is rank ", hello.rank, ", which this rank does not expect a link from");
    }
    replyHello(s, refusal, helloBy);
    if (!refusal.empty()) {
      logWarning(makeString("init: refused a ring connection from ", peer, ": ", refusal));
      continue;
    }
    int from = static_cast<int>(hello.rank);
    expected.erase(from);
    accepted[from] = Pair{std::move(s), from, peer};
  }
  if (expected.empty()) return accepted;
  std::string missing;
  for (int r : expected) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  throw TimeoutError(makeString(rankPrefix(), "init: Timeout waiting for peers: rank ", missing,
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

  // This rank dials its right neighbour and its higher-ranked partners; it accepts its left
  // neighbour and its lower-ranked partners. Hellos go out before any answer is awaited.
  const int rightRank = (rank + 1) % n, leftRank = (rank + n - 1) % n;
  std::vector<int> dial{rightRank};
  std::set<int> accept{leftRank};
  for (int p : butterflyPartners(rank, n)) (p > rank ? dial.push_back(p) : (void)accept.insert(p));
  wire::Hello hello;
  hello.channel = wire::Channel::Ring;
  hello.jobHash = wire::hashJobId(config.jobId);
  hello.worldSize = static_cast<uint32_t>(n);
  hello.rank = static_cast<uint32_t>(rank);
  hello.generation = config.generation;
  std::vector<Pair> dialed;
  for (int p : dial) {
    dialed.push_back(dialPeer(p, store.get(addressKey(p), deadline), deadline));
    sendHello(dialed.back().socket, hello, config.secret, deadline);
  }
  std::map<int, Pair> accepted = acceptPeers(config, listener, published, accept, deadline);
  for (Pair& pair : dialed) {
    HelloAnswer answer = awaitHelloReply(pair.socket, deadline);
    if (answer.kind != HelloAnswer::Welcome) {
      throw NetworkError(makeString(rankPrefix(), "init: ", pair.name(), " refused this rank's link: ", answer.reason));
    }
  }
  RingLinks links;
  links.right = std::move(dialed[0]);
  links.left = std::move(accepted[leftRank]);
  for (int p : butterflyPartners(rank, n)) {
    if (p > rank) {
      for (Pair& pair : dialed) {
        if (pair.rank == p && pair.socket.valid()) links.partners.push_back(std::move(pair));
      }
    } else {
      links.partners.push_back(std::move(accepted[p]));
    }
  }
  return links;
}

std::vector<int> butterflyPartners(int rank, int worldSize) {
  std::vector<int> partners;
  if (worldSize < 4 || (worldSize & (worldSize - 1)) != 0) return partners;
  for (int d = 2; d < worldSize; d *= 2) partners.push_back(rank ^ d);
  return partners;
}

}  // namespace cyxwiz::comm
