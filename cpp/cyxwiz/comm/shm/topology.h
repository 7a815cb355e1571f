// Which ranks share this host, decided at rendezvous and proved, never assumed from a host name.
//
// Every rank publishes its host identity (boot id, IPC namespace, the /dev/shm it sees, its uid) and
// its CYXWIZ_TRANSPORT. When every rank of the job has the same identity, the lowest rank creates a
// segment and publishes its name and a random token; the others attach it and read the token back.
// Only when all of them did is the shared-memory transport used; the creator unlinks the name as
// soon as every rank has answered, whatever the answers.
#pragma once

#include <memory>
#include <string>

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/comm/shm/group.h"
#include "cyxwiz/comm/store.h"

namespace cyxwiz::comm::shm {

// Bytes of one half-slot: an all-reduce chunk. Tuned in benchmarks/allreduce.py (docs/scaling.md).
constexpr size_t kHalfBytes = 256 * 1024;

// The group of every rank of the job, or null when the job stays on TCP (CYXWIZ_TRANSPORT=tcp, ranks
// on several hosts, a segment that could not be shared; the reason goes to *whyNot). With
// CYXWIZ_TRANSPORT=shm the last two raise instead, naming the rank and the reason. Every rank
// reaches the same decision. InvalidArgument when the ranks' CYXWIZ_TRANSPORT values differ.
std::unique_ptr<Group> formGroup(const DistributedConfig& config, Store& store, Deadline deadline, std::string* whyNot);

// This process's host identity: processes with equal identities may share a segment (then proved).
std::string hostIdentity();

}  // namespace cyxwiz::comm::shm
