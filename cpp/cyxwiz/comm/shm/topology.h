// Which ranks share a host, decided at rendezvous and proved, never assumed from a host name.
//
// Every rank publishes its host identity (boot id, IPC namespace, the /dev/shm it sees, its uid) and
// its CYXWIZ_TRANSPORT; ranks with equal identities are one host (a hint, then proved). On each host
// the lowest rank creates a segment and publishes its name and a random token; the others attach it
// and read the token back. Only when every rank of the job did is shared memory used, by all; each
// creator unlinks its name as soon as every rank has answered, whatever the answers.
//
// One host: shared memory for every collective. Several hosts with the same number (2 or more) of
// ranks each: shared memory inside each host and a ring between hosts per local index (hierarchical
// all-reduce). Otherwise TCP only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/comm/shm/group.h"
#include "cyxwiz/comm/store.h"

namespace cyxwiz::comm::shm {

// Bytes of one half-slot: an all-reduce chunk. Tuned in benchmarks/allreduce.py (docs/scaling.md).
constexpr size_t kHalfBytes = 256 * 1024;

// The job's hosts as the ranks' published identities group them (not yet proved).
struct Hosts {
  std::vector<std::vector<int>> ranks;  // each host's ranks, ascending; hosts ordered by their lowest rank
  int host = 0, local = 0;              // this rank's host and its index there
  std::string transport;                // CYXWIZ_TRANSPORT, the same on every rank
  bool samePidNamespace = true;         // every rank's pids mean something to every other
  int count() const { return static_cast<int>(ranks.size()); }
  // Several hosts, each with the same number (2 or more) of ranks: worth a hierarchy.
  bool hierarchical() const;
  // The rank with local index `local` on host `host`.
  int at(int host, int local) const { return ranks[static_cast<size_t>(host)][static_cast<size_t>(local)]; }
};

// Publishes this rank's identity (before its ring address, so that whoever has every address
// finds every identity at once).
void publishHost(const DistributedConfig& config, Store& store, Deadline deadline);
// Every rank's identity. InvalidArgument (raised on every rank) when the ranks' CYXWIZ_TRANSPORT
// values differ.
Hosts readHosts(const DistributedConfig& config, Store& store, Deadline deadline);

// This rank's host group, or null when the job stays on TCP alone (CYXWIZ_TRANSPORT=tcp, ranks alone
// on their hosts or hosts of different sizes, a segment that could not be shared; the reason goes
// to *whyNot). With CYXWIZ_TRANSPORT=shm all but the first raise instead, naming the rank and the
// reason. Every rank reaches the same decision.
std::unique_ptr<Group> formGroup(const DistributedConfig& config, Store& store, const Hosts& hosts, Deadline deadline,
                                 std::string* whyNot);

// This process's host identity: processes with equal identities may share a segment (then proved).
std::string hostIdentity();

}  // namespace cyxwiz::comm::shm
