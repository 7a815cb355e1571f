// TEST DOUBLE, NOT GPU SUPPORT. The emulated NCCL between ranks in separate processes of one machine:
// a POSIX shared-memory segment per communicator, named from the random token of the unique id, holding
// a control block and one staging slot per rank (copied from the old emulator's emulated_nccl.h). The
// communicator (comm.h) runs it on the stream's worker thread; this file moves the bytes and does the
// reductions.
//
// A collective is synchronous in the calling (worker) thread, in phases of
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

#include <nccl.h>

namespace cxemu::nccl {

using Status = std::string;  // empty: success; else why

// Bytes of one element of `t` (0 for a type the emulator does not reduce: only 32/64-bit ints and floats,
// float16 and bfloat16).
size_t elemBytes(ncclDataType_t t);

enum class CollectiveKind { AllReduce, Broadcast, AllGather, ReduceScatter };

constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

// A tag, then 32 hex digits from /dev/urandom, NUL-padded to kNcclUniqueIdBytes.
std::string makeNcclUniqueId();
// Whether `id` is one that makeNcclUniqueId made (tag and token).
bool isNcclUniqueId(const std::string& id);

// One collective's arguments, as the ncclAllReduce... entry point got them (checked there).
struct CollectiveCall {
  CollectiveKind kind;
  const void* send;  // count elements; nranks * count for ReduceScatter
  void* recv;        // count elements; nranks * count for AllGather
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
};

const char* collectiveName(CollectiveKind kind);  // "ncclAllReduce"...

// How a collective between processes ended.
enum class Exchange {
  Done,     // recv holds the result
  Hung,     // the peers did not all come within the deadline: the collective never completes
  Failed,   // a peer aborted, left or exited (remote error), or the ranks called different collectives
            // (invalid usage, mismatch() true): *why says so
  Aborted,  // this rank's communicator was aborted (from another thread) while it waited
};

// This process's rank of a communicator of nranks > 1: its mapping of the shared segment. Not copyable.
// run() may wait in one (worker) thread while abort() or leave() is called from another; the communicator
// never runs two collectives at once (it refuses the second, see collectives.cpp).
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
  void leave();  // ncclCommDestroy; also ends a run() waiting in another thread
  // How many ranks have joined the segment so far (a non-blocking init completes once all have).
  int joined() const;
  // Whether the last Failed run() was a mismatch of the ranks' collectives (invalid usage).
  bool mismatch() const { return mismatch_; }

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
  bool mismatch_ = false;
};

}  // namespace cxemu::nccl
