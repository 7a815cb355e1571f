// TEST DOUBLE, NOT GPU SUPPORT. The emulated NCCL communicator (private to nccl/*.cpp).
//
// Model (NCCL >= 2.26, non-blocking communicators): a non-blocking init or collective returns
// ncclInProgress and is finished by the communicator's helper thread a few ms later; until then
// ncclCommGetAsyncError reports ncclInProgress and any other call on the communicator fails with
// ncclInvalidArgument ("Attempt to use communicator before the previous operation returned
// ncclSuccess", NCCL's ncclCommEnsureReady). A collective's data movement runs as work enqueued on the
// user's stream (cxemu::enqueue), on that stream's worker thread. Finalize completes once the
// enqueued work has completed and no CUDA graph holds the communicator; abort and destroy wait for
// those graphs too (NCCL's commDestroySync polls localPersistentRefs).
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "nccl/shared_comm.h"

// The object behind ncclComm_t. Shared: the work a stream or a graph holds keeps it alive after the
// handle is destroyed or aborted (the handle's own reference is in the registry, comm.cpp).
struct ncclComm {
  int nranks = 1;
  int rank = 0;
  int dev = 0;
  bool blocking = true;
  std::string id;  // the unique id's 128 bytes

  std::mutex mu;
  std::condition_variable cv;  // state changes: released, helper tasks, work done
  bool initDone = false;       // init finished (successfully or not)
  ncclResult_t error = ncclSuccess;  // the sticky asynchronous error
  int deferred = 0;            // collectives that returned ncclInProgress and are not enqueued yet
  int inFlight = 0;            // collectives enqueued (not captured) and not completed yet
  bool finalizing = false;     // ncclCommFinalize called
  bool finalized = false;      // ... and completed
  bool released = false;       // aborted or destroyed: blocked work returns, queued work is skipped
  bool broken = false;         // a collective hung or failed: later ones never complete
  int running = 0;             // collectives executing on some worker right now
  std::thread::id runningOn;   // ... on this worker
  const char* runningWhat = "";

  std::unique_ptr<cxemu::nccl::SharedComm> shared;  // nranks > 1, once init opened it

  // The helper thread (non-blocking communicators): runs tasks in call order, each at its due time.
  struct Task {
    std::chrono::steady_clock::time_point due;
    std::function<void()> run;
  };
  std::thread helper;
  std::deque<Task> tasks;
  bool stopHelper = false;
  std::mt19937 rng;

  ~ncclComm();
};

namespace cxemu::nccl {

using CommPtr = std::shared_ptr<ncclComm>;

// The live communicator behind a handle, or null (never created, destroyed or aborted).
CommPtr lookup(ncclComm_t handle);

// NCCL's last-error text (one for the process, as NCCL's ncclGetLastError) and how a failing call
// reports: sets the text and returns `r`.
ncclResult_t fail(ncclResult_t r, const std::string& message);
// Sets the communicator's sticky asynchronous error (the first one stays) and the last-error text.
void setAsyncError(ncclComm& c, ncclResult_t r, const std::string& message);

// NCCL's ncclCommEnsureReady: ncclInvalidArgument while an operation is in progress, the sticky error
// if there is one, else ncclSuccess. `c.mu` held. `inGroup`: collectives of one group may follow each
// other while the group's earlier ones are still being enqueued.
ncclResult_t ensureReadyLocked(ncclComm& c, bool inGroup);

// Runs `task` on the communicator's helper thread after a random delay in [minMs, maxMs] ms.
void defer(ncclComm& c, int minMs, int maxMs, std::function<void()> task);
int randomMs(ncclComm& c, int minMs, int maxMs);  // c.mu held

// Until abort/destroy releases the communicator (a collective that never completes).
void blockUntilReleased(ncclComm& c);

// The calling thread's NCCL group depth (ncclGroupStart/End).
int groupDepth();

// The NCCL version the emulator plays: NCCL_VERSION_CODE, or CYXWIZ_EMULATED_NCCL_VERSION (a code
// such as 22809 for 2.28.9), which also brings back that version's known defects (collectives.cpp).
int emulatedVersion();

}  // namespace cxemu::nccl
