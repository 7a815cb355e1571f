// TEST DOUBLE, NOT GPU SUPPORT. The emulated NCCL between ranks in separate processes of one machine:
// a POSIX shared-memory segment per communicator, named from the random token of the unique id, holding
// a control block and one staging slot per rank. emulated_cuda.cpp keeps the ABI's checks, streams and
// graph capture; this file moves the bytes and does the reductions. See README.md beside this file.
//
// A collective is synchronous in the calling thread (at graphLaunch for a captured one), in phases of
// at most one slot per rank: wait until every rank has read the previous phase's slots, copy this
// rank's part into its slot, arrive, wait until every rank has arrived (bounded), compute the result
// from all slots in rank order (so every rank gets the same bits), mark the slots read. The wait is
// bounded by DISTRIBUTED_TIMEOUT_MS (read once per communicator, 30 s when unset): past it the
// collective hangs, as a real one whose peer never comes, and the engine's own timeout aborts. A peer
// that aborted or destroyed its communicator ends the wait at once, one that exited within 100 ms, with
// NCCL's remote error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda::emulated {

// Bytes of one element of `t` (0 for an unknown type).
size_t elemBytes(ElemType t);

constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

// A tag, then 32 hex digits from /dev/urandom, NUL-padded to kNcclUniqueIdBytes.
std::string makeNcclUniqueId();
// Whether `id` is one that makeNcclUniqueId made (tag and token).
bool isNcclUniqueId(const std::string& id);

// One collective's arguments, as ncclCollective got them (checked there).
struct CollectiveCall {
  CollectiveKind kind;
  const void* send;  // count elements; nranks * count for ReduceScatter
  void* recv;        // count elements; nranks * count for AllGather
  size_t count;
  ElemType type;
  ReduceKind op;
  int root;
};

const char* collectiveName(CollectiveKind kind);  // "ncclAllReduce"...

// How a collective between processes ended.
enum class Exchange {
  Done,     // recv holds the result
  Hung,     // the peers did not all come within the deadline: the collective never completes
  Failed,   // a peer aborted, left or exited, or the ranks called different collectives: *why says so
  Aborted,  // this rank's communicator was aborted (from another thread) while it waited
};

// This process's rank of a communicator of nranks > 1: its mapping of the shared segment. Not copyable.
// run() may wait in one thread while abort() is called from another; everything else is called under
// the emulator's lock, never concurrently with run() except abort().
class SharedComm {
 public:
  // Opens (or creates) the segment of `id` for `nranks` and joins it as `rank`. On failure, returns why
  // (a sentence without the call's name) and leaves *out null.
  static Status open(const std::string& id, int nranks, int rank, SharedComm** out);
  ~SharedComm();  // unmaps; leave() or abort() first
  SharedComm(const SharedComm&) = delete;
  SharedComm& operator=(const SharedComm&) = delete;

  Exchange run(const CollectiveCall& call, std::string* why);
  // This rank leaves for good: peers waiting for it stop with a remote error. Idempotent.
  void abort();  // ncclCommAbort; also ends a run() waiting in another thread
  void leave();  // ncclCommDestroy

  int64_t timeoutMs() const { return timeoutMs_; }
  uint64_t collectives() const { return sequence_; }

 private:
  struct Header;
  struct RankEntry;
  SharedComm() = default;
  Header* header() const;
  RankEntry* entry(int rank) const;
  char* slot(int rank) const;
  void depart(int32_t state);
  void unlinkName();
  // Waits until every rank's arrival counter reaches `target`, or the deadline (CLOCK_MONOTONIC ns).
  Exchange waitAll(uint64_t target, int64_t deadline, const CollectiveCall& call, std::string* why);
  Exchange giveUp(Exchange e);  // after a wait that did not end Done
  // Whether every rank runs the same collective as this one (phase 0 of a collective, after arriving).
  bool sameCollective(const CollectiveCall& call, std::string* why) const;

  char* base_ = nullptr;  // the mapping
  size_t bytes_ = 0;
  size_t slotsAt_ = 0;    // offset of slot 0
  char name_[96] = {};
  int nranks_ = 0;
  int rank_ = 0;
  int64_t timeoutMs_ = 30000;
  size_t slotBytes_ = 0;
  uint64_t phase_ = 0;     // phases (one slot's worth each) exchanged so far: the same on every rank
  uint64_t sequence_ = 0;  // collectives run so far: the same on every rank
  bool broken_ = false;    // a collective hung or failed: nothing moves on this communicator any more
  std::atomic<bool> aborted_{false};  // set by abort(), from any thread
  bool departed_ = false;
};

}  // namespace cyxwiz::cuda::emulated
