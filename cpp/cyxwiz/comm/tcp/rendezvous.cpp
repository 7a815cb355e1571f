#include "cyxwiz/comm/tcp/rendezvous.h"

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>
#include <thread>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/comm/tcp/hello_gate.h"
#include "cyxwiz/comm/tcp/tcp_store.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::tcp {

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

// A link this rank dialed, its hello under way.
struct Dialed {
  Pair pair;
  CallerHello hello;
  std::vector<uint8_t> in;
};

// Reads what the acceptor sent and advances the handshake; throws when it refused the link.
void advanceDialed(Dialed& d, Deadline deadline) {
  size_t have = d.in.size();
  d.in.resize(d.hello.need());
  IoStatus st = d.pair.socket.recvSome(d.in.data() + have, d.in.size() - have);
  d.in.resize(have + st.done);
  if (!st.ok()) {
    throw NetworkError(makeString(rankPrefix(), "init: ", d.pair.name(), " closed this rank's link during the hello: ",
                                  st.describe(), " (it failed, or refused this rank without a reason)"));
  }
  if (d.in.size() < d.hello.need()) return;
  std::vector<uint8_t> out = d.hello.feed(d.in.data());
  d.in.clear();
  if (!out.empty() && !(st = d.pair.socket.sendAll(out.data(), out.size(), deadline)).ok()) {
    throw NetworkError(makeString(rankPrefix(), "init: ", d.pair.name(), " left during the hello: ", st.describe()));
  }
  if (d.hello.done() && d.hello.answer().kind != HelloAnswer::Welcome) {
    throw NetworkError(makeString(rankPrefix(), "init: ", d.pair.name(), " refused this rank's link: ", d.hello.answer().reason));
  }
}

// Runs the hellos of the links this rank dialed and accepts the ranks in `expected`, all under one
// poll: strangers on the ring port (silent, garbled, another job) wait or are refused beside the
// real ranks, never in front of them.
// A link to accept: from `rank`, on the world ring (or butterfly) or on the ring between hosts.
using LinkKey = std::pair<int, bool>;

std::map<LinkKey, Pair> handshakeLinks(const DistributedConfig& config, HelloGate& gate, std::vector<Dialed>& dialed,
                                       const std::string& published, const std::set<LinkKey>& accept,
                                       Deadline deadline) {
  std::set<LinkKey> expected = accept;
  JobIdentity job = jobIdentityOf(config);
  HelloGate::Decide decide = [&](const wire::Hello& hello, const std::string&, bool* later) -> std::string {
    *later = false;
    std::string refusal = checkGeneration(hello, job);
    const LinkKey key{static_cast<int>(hello.rank), (hello.flags & wire::kHelloHostLink) != 0};
    if (refusal.empty() && expected.count(key) == 0) {
      refusal = makeString("it is rank ", hello.rank, ", which this rank does not expect a", key.second ? " host" : "",
                           " link from (any more)");
    }
    if (refusal.empty()) expected.erase(key);
    return refusal;
  };
  std::map<LinkKey, Pair> accepted;
  std::vector<platform::PollFd> fds;
  auto dialing = [&] { return std::any_of(dialed.begin(), dialed.end(), [](Dialed& d) { return !d.hello.done(); }); };
  while ((!expected.empty() || dialing()) && Clock::now() < deadline) {
    throwIfInterrupted("init");
    fds.clear();
    for (Dialed& d : dialed) fds.push_back(platform::pollEntry(d.hello.done() ? platform::kNoSocket : d.pair.socket.fd(), POLLIN));
    gate.addPollFds(fds);
    int timeout = std::min(100, msUntil(deadline));
    int gateMs = gate.msUntilNextDeadline();
    if (gateMs >= 0) timeout = std::min(timeout, gateMs + 1);
    int err = 0;
    int rc = platform::pollSockets(fds.data(), fds.size(), timeout, &err);
    if (rc < 0 && err != EINTR) throw NetworkError(makeString(rankPrefix(), "init: poll failed: ", errnoString(err)));
    for (size_t i = 0; rc > 0 && i < dialed.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) advanceDialed(dialed[i], deadline);
    }
    for (auto& arrival : gate.handle(fds.data() + dialed.size(), decide)) {
      int from = static_cast<int>(arrival.hello.rank);
      accepted[{from, (arrival.hello.flags & wire::kHelloHostLink) != 0}] = Pair{std::move(arrival.socket), from, arrival.address};
    }
  }
  if (!expected.empty()) {
    std::set<int> ranks;
    for (const LinkKey& k : expected) ranks.insert(k.first);
    std::string missing;
    for (int r : ranks) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw TimeoutError(makeString(rankPrefix(), "init: Timeout waiting for peers: rank ", missing,
                                  " did not connect to this rank's published address ", published, " within ",
                                  config.timeoutMs, " ms (a firewall may block the ports that ranks open for each other)"));
  }
  for (const LinkKey& k : accept) {
    if (!accepted.count(k)) throw NetworkError(makeString(rankPrefix(), "init: rank ", k.first, " left during its hello to this rank"));
  }
  for (Dialed& d : dialed) {
    if (!d.hello.done()) {
      throw TimeoutError(makeString(rankPrefix(), "init: Timeout waiting for peers: ", d.pair.name(), " did not answer "
                                    "this rank's hello within ", config.timeoutMs, " ms"));
    }
  }
  return accepted;
}

// How long a connection to the ring port may take to say its hello: ranks say it at once.
constexpr int64_t kRingHelloTimeoutMs = 3000;

}  // namespace

RingLinks connectRing(const DistributedConfig& config, Store& store, const std::string& localIp, Deadline deadline,
                      const std::function<HostRing()>& askHostRing) {
  const int rank = config.rank, n = config.worldSize;
  int err = 0;
  // Only on the interface the others reach this rank on (loopback for a loopback job).
  Socket listener = Socket::listenOn(localIp, 0, 64, &err);
  if (!listener.valid()) {
    throw NetworkError(makeString(rankPrefix(), "init: cannot open a listening socket on ", localIp, ": ", errnoString(err)));
  }
  const std::string published = makeString(localIp, ":", listener.localPort());
  auto gate = std::make_unique<HelloGate>(std::move(listener), jobIdentityOf(config), true,
                                          std::min<int64_t>(config.timeoutMs, kRingHelloTimeoutMs), "init: ring port");
  store.set(addressKey(rank), published, deadline);

  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(addressKey(r));
  std::vector<std::string> missing = store.waitAll(keys, deadline);
  if (!missing.empty()) missingRanks(config, missing);
  const HostRing hostRing = askHostRing ? askHostRing() : HostRing{};

  // This rank dials its right neighbour and its higher-ranked partners; it accepts its left
  // neighbour and its lower-ranked partners. Hellos go out before any answer is awaited.
  const int rightRank = (rank + 1) % n, leftRank = (rank + n - 1) % n;
  std::vector<LinkKey> dial{{rightRank, false}};
  std::set<LinkKey> accept{{leftRank, false}};
  for (int p : butterflyPartners(rank, n)) (p > rank ? dial.push_back({p, false}) : (void)accept.insert({p, false}));
  if (hostRing.right >= 0) dial.push_back({hostRing.right, true});
  if (hostRing.left >= 0) accept.insert({hostRing.left, true});
  for (int p : hostRing.partners) (p > rank ? dial.push_back({p, true}) : (void)accept.insert({p, true}));
  wire::Hello hello;
  hello.channel = wire::Channel::Ring;
  hello.jobHash = wire::hashJobId(config.jobId);
  hello.worldSize = static_cast<uint32_t>(n);
  hello.rank = static_cast<uint32_t>(rank);
  hello.generation = config.generation;
  std::vector<Dialed> dialed;
  for (const auto& [p, hostLink] : dial) {
    wire::Hello h = hello;
    if (hostLink) h.flags |= wire::kHelloHostLink;
    dialed.push_back({dialPeer(p, store.get(addressKey(p), deadline), deadline), CallerHello(h, config.secret, p), {}});
    const std::vector<uint8_t>& opening = dialed.back().hello.opening();
    IoStatus st = dialed.back().pair.socket.sendAll(opening.data(), opening.size(), deadline);
    if (!st.ok()) {
      throw NetworkError(makeString(rankPrefix(), "init: ", dialed.back().pair.name(), " closed this rank's link: ", st.describe()));
    }
  }
  std::map<LinkKey, Pair> accepted = handshakeLinks(config, *gate, dialed, published, accept, deadline);
  RingLinks links;
  for (int r = 0; r < n; ++r) links.addresses.push_back(r == rank ? published : store.get(addressKey(r), deadline));
  links.gate = std::move(gate);
  links.right = std::move(dialed[0].pair);
  links.left = std::move(accepted[{leftRank, false}]);
  for (int p : butterflyPartners(rank, n)) {
    if (p > rank) {
      for (size_t i = 0; i < dial.size(); ++i) {
        if (dial[i] == LinkKey{p, false}) links.partners.push_back(std::move(dialed[i].pair));
      }
    } else {
      links.partners.push_back(std::move(accepted[{p, false}]));
    }
  }
  auto dialedTo = [&](const LinkKey& key) -> Pair& {
    return dialed[static_cast<size_t>(std::find(dial.begin(), dial.end(), key) - dial.begin())].pair;
  };
  if (hostRing.right >= 0) links.hostRight = std::move(dialedTo({hostRing.right, true}));
  if (hostRing.left >= 0) links.hostLeft = std::move(accepted[{hostRing.left, true}]);
  for (int p : hostRing.partners) {
    links.hostPartners.push_back(p > rank ? std::move(dialedTo({p, true})) : std::move(accepted[{p, true}]));
  }
  return links;
}

std::vector<int> butterflyPartners(int rank, int worldSize) {
  std::vector<int> partners;
  if (worldSize < 4 || (worldSize & (worldSize - 1)) != 0) return partners;
  for (int d = 2; d < worldSize; d *= 2) partners.push_back(rank ^ d);
  return partners;
}

}  // namespace cyxwiz::comm::tcp
