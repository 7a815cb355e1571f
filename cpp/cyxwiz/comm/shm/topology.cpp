#include "cyxwiz/comm/shm/topology.h"

#include <sstream>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/platform/process.h"

namespace cyxwiz::comm::shm {

namespace {

std::string hostKey(int rank) { return makeString("cyxwiz/shm/host/", rank); }
std::string attachedKey(int rank) { return makeString("cyxwiz/shm/attached/", rank); }
const char* const kSegmentKey = "cyxwiz/shm/segment";

// Every rank reaches the same verdict from the same records. Rank 0 serves the store: raising first,
// it would take the store down under ranks still reading them, which would then report that instead
// of the verdict. So every rank says it has read them, and rank 0 raises only once all have.
[[noreturn]] void raiseTogether(Store& store, const DistributedConfig& config, const char* stage, Deadline deadline,
                                const Error& error) {
  store.set(makeString("cyxwiz/shm/", stage, "/", config.rank), "1", deadline);
  if (config.rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < config.worldSize; ++r) keys.push_back(makeString("cyxwiz/shm/", stage, "/", r));
    store.waitAll(keys, deadline);
  }
  if (dynamic_cast<const InvalidArgument*>(&error)) throw InvalidArgument(error.what());
  throw BackendError(error.what());
}

struct Record {
  std::string transport, shmAlgorithm, identity, pidNamespace;
};

// "<transport> <shm algorithm> <pid namespace> <identity>" (the identity may hold anything but a newline).
std::string encode(const Record& r) { return r.transport + " " + r.shmAlgorithm + " " + r.pidNamespace + " " + r.identity; }
Record decode(const std::string& s) {
  Record r;
  std::istringstream in(s);
  in >> r.transport >> r.shmAlgorithm >> r.pidNamespace;
  std::getline(in >> std::ws, r.identity);
  return r;
}

}  // namespace

std::string hostIdentity() { return platform::hostIdentity(); }

bool Hosts::hierarchical() const {
  if (count() < 2) return false;
  for (const auto& h : ranks) {
    if (h.size() < 2 || h.size() != ranks[0].size()) return false;
  }
  return true;
}

namespace {

Record myRecord(const DistributedConfig& config) {
  return Record{config.transport, config.shmAlgorithm, hostIdentity(), platform::pidNamespace()};
}

}  // namespace

void publishHost(const DistributedConfig& config, Store& store, Deadline deadline) {
  store.set(hostKey(config.rank), encode(myRecord(config)), deadline);
}

Hosts readHosts(const DistributedConfig& config, Store& store, Deadline deadline) {
  const int n = config.worldSize, me = config.rank;
  const Record mine = myRecord(config);
  std::vector<Record> all;
  for (int r = 0; r < n; ++r) all.push_back(r == me ? mine : decode(store.get(hostKey(r), deadline)));
  for (int r = 0; r < n; ++r) {
    if (all[r].transport != mine.transport) {
      raiseTogether(store, config, "read", deadline, InvalidArgument(makeString(rankPrefix(), "init: CYXWIZ_TRANSPORT differs between ranks: rank ", me, " has '",
                                       mine.transport, "', rank ", r, " has '", all[r].transport,
                                       "'; set the same value on every rank (or none: auto)")));
    }
    if (all[r].shmAlgorithm != mine.shmAlgorithm) {
      raiseTogether(store, config, "read", deadline, InvalidArgument(makeString(rankPrefix(), "init: CYXWIZ_SHM_ALGORITHM differs between ranks: rank ", me, " has '",
                                       mine.shmAlgorithm, "', rank ", r, " has '", all[r].shmAlgorithm,
                                       "'; set the same value on every rank (or none: direct)")));
    }
  }
  Hosts hosts;
  hosts.transport = mine.transport;
  for (int r = 0; r < n; ++r) {
    hosts.samePidNamespace = hosts.samePidNamespace && all[r].pidNamespace == mine.pidNamespace;
    int h = 0;
    while (h < hosts.count() && all[hosts.ranks[h][0]].identity != all[r].identity) ++h;
    if (h == hosts.count()) hosts.ranks.emplace_back();
    if (r == me) hosts.host = h, hosts.local = static_cast<int>(hosts.ranks[h].size());
    hosts.ranks[h].push_back(r);
  }
  return hosts;
}

namespace {

// Why these hosts cannot use shared memory at all, or "" when they can try. Measured against rank
// 0's host, so that every rank names the same ranks.
std::string unshareable(const Hosts& hosts) {
  if (hosts.count() == 1 || hosts.hierarchical()) return "";
  std::string list, sizes;
  size_t elsewhere = 0;
  for (size_t h = 1; h < hosts.ranks.size(); ++h) {
    for (int r : hosts.ranks[h]) list += makeString(elsewhere++ ? ", " : "", r);
  }
  for (const auto& h : hosts.ranks) sizes += makeString(sizes.empty() ? "" : ", ", h.size());
  return makeString(elsewhere == 1 ? "rank " : "ranks ", list, elsewhere == 1 ? " is" : " are",
                    " on another host than rank 0 (or in another IPC namespace or /dev/shm), and shared memory across "
                    "hosts needs the same number of ranks, at least 2, on every host (here ", sizes, ")");
}

}  // namespace

std::unique_ptr<Group> formGroup(const DistributedConfig& config, Store& store, const Hosts& hosts, Deadline deadline,
                                 std::string* whyNot) {
  const int n = config.worldSize, me = config.rank;
  if (hosts.transport == "tcp") {
    *whyNot = "CYXWIZ_TRANSPORT=tcp";
    return nullptr;
  }
  *whyNot = unshareable(hosts);
  if (!whyNot->empty()) {
    if (hosts.transport == "shm") {
      raiseTogether(store, config, "read", deadline,
                    InvalidArgument(makeString(rankPrefix(), "init: CYXWIZ_TRANSPORT=shm, but ", *whyNot,
                                               "; unset CYXWIZ_TRANSPORT (auto) or set it to tcp")));
    }
    return nullptr;
  }

  // Each host's lowest rank creates; everyone attaches and reads the token back; the creators
  // unlink once every rank of the job has answered.
  const std::vector<int>& mates = hosts.ranks[static_cast<size_t>(hosts.host)];
  const int ranksHere = static_cast<int>(mates.size());
  const size_t bytes = Group::segmentBytes(ranksHere, kHalfBytes);
  const std::string segmentKey = makeString(kSegmentKey, "/", mates[0]);
  Segment segment;
  std::string problem;
  if (hosts.local == 0) {
    try {
      segment = Segment::create(bytes);
      std::string token = randomHex(Group::kTokenBytes / 2);
      Group::format(segment, ranksHere, kHalfBytes, token);
      store.set(segmentKey, segment.name() + " " + token, deadline);
    } catch (const Error& e) {
      problem = e.what();
      store.set(segmentKey, "- " + problem, deadline);
    }
  } else {
    std::istringstream published(store.get(segmentKey, deadline));
    std::string name, token;
    published >> name;
    std::getline(published >> std::ws, token);
    if (name == "-") {
      problem = makeString("rank ", mates[0], " could not create the segment: ", token);
    } else {
      try {
        segment = Segment::attach(name, bytes);
        problem = Group::verify(segment, ranksHere, kHalfBytes, token);
      } catch (const Error& e) {
        problem = e.what();
      }
    }
  }
  std::unique_ptr<Group> group;
  if (problem.empty()) {
    group = std::make_unique<Group>(std::move(segment), mates, hosts.local, kHalfBytes);
    group->control(hosts.local).pid = static_cast<int32_t>(platform::currentPid());  // before we answer: peers read it after
  }
  store.set(attachedKey(me), problem.empty() ? "ok" : "no " + problem, deadline);

  std::vector<std::string> failures;
  for (int r = 0; r < n; ++r) {
    std::string answer = r == me ? (problem.empty() ? "ok" : "no " + problem) : store.get(attachedKey(r), deadline);
    if (answer != "ok") failures.push_back(makeString("rank ", r, ": ", answer.substr(3)));
  }
  if (hosts.local == 0 && group) group->segment().unlink();
  if (!failures.empty()) {
    *whyNot = makeString("shared memory could not be shared (", failures.front(), ")");
    if (hosts.transport == "shm") {
      raiseTogether(store, config, "answered", deadline,
                    BackendError(makeString(rankPrefix(), "init: CYXWIZ_TRANSPORT=shm, but ", *whyNot,
                                            "; unset CYXWIZ_TRANSPORT (auto) to fall back to TCP")));
    }
    return nullptr;
  }
  group->checkPids = hosts.samePidNamespace;
  return group;
}

}  // namespace cyxwiz::comm::shm
