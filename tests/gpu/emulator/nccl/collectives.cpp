// TEST DOUBLE, NOT GPU SUPPORT. The emulated NCCL collectives: argument checks on the host, then the
// data movement enqueued on the user's stream (at once on a blocking communicator; a few ms later, by
// the helper thread, on a non-blocking one, which reports ncclInProgress until then). On the stream's
// worker: one rank copies; several exchange through shared memory (shared_comm.h). While the stream
// is being captured the work is recorded into the graph, which then holds the communicator.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "nccl/comm.h"
#include "nccl/text.h"
#include "runtime/emu.h"

namespace cxemu::nccl {

namespace {

std::atomic<int> misuses{0};
thread_local int groupDepth_ = 0;
thread_local bool groupDeferred_ = false;  // the open group holds a collective of a non-blocking comm

// Bytes of one element of any NCCL type (a single rank copies any of them).
size_t typeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// How many leading elements NCCL's one-rank kernel writes for AVG of a float type (ncclDevPreMulSum,
// src/device/onerank.cu): before 2.29.7 it gave each of min(32, bytes / 16 KiB rounded up) blocks
// alignUp(n / blocks, 16-byte pack) elements, the quotient rounded down, so the last n % blocks or so
// elements were never written (NVIDIA/nccl#1950; seen on an H200 with 2.28.9). All of them since.
size_t oneRankAvgWritten(const CollectiveCall& call, size_t itemBytes) {
  const bool floating = call.type == ncclFloat16 || call.type == ncclBfloat16 || call.type == ncclFloat32 ||
                        call.type == ncclFloat64;
  if (call.op != ncclAvg || !floating || emulatedVersion() >= 22907 || call.count == 0) return call.count;
  const size_t blocks = std::min<size_t>(32, (call.count * itemBytes + (16 << 10) - 1) / (16 << 10));
  const size_t pack = 16 / itemBytes;
  const size_t perBlock = (call.count / blocks + pack - 1) / pack * pack;
  return std::min(call.count, blocks * perBlock);
}

bool hangRequested() {  // read at each collective that runs, a replayed one included
  const char* hang = std::getenv("CYXWIZ_EMULATED_NCCL_HANG");
  return hang && std::strcmp(hang, "1") == 0;
}

// Completion of one enqueued (not captured) collective, for finalize: done when the work has run, or
// when the runtime drops it unrun (a lost context), as the last copy of the work is destroyed.
struct InFlight {
  explicit InFlight(CommPtr comm) : c(std::move(comm)) {
    std::lock_guard<std::mutex> lock(c->mu);
    ++c->inFlight;
  }
  ~InFlight() { done(); }
  void done() {
    std::lock_guard<std::mutex> lock(c->mu);
    if (finished) return;
    finished = true;
    --c->inFlight;
    c->cv.notify_all();
  }
  CommPtr c;
  bool finished = false;
};

// Whether another worker runs a collective of `c` right now: a usage NCCL would deadlock or corrupt
// on (two streams' kernels of one communicator). Otherwise marks this worker as running one.
bool enterExclusive(ncclComm& c, const char* what) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.running > 0 && c.runningOn != std::this_thread::get_id()) {
    misuses.fetch_add(1);
    const std::string msg =
        cat("emulator: two collectives of one NCCL communicator ran concurrently on different streams (", what,
            " started on cuda:", c.dev, " while ", c.runningWhat, " of the same communicator, rank ", c.rank, " of ",
            c.nranks, ", was still running on another stream: order them, e.g. make the second stream wait for "
            "an event recorded after the first collective)");
    std::fprintf(stderr, "%s\n", msg.c_str());
    setAsyncError(c, ncclInvalidUsage, msg);
    return false;
  }
  ++c.running;
  c.runningOn = std::this_thread::get_id();
  c.runningWhat = what;
  return true;
}

void leaveExclusive(ncclComm& c) {
  std::lock_guard<std::mutex> lock(c.mu);
  --c.running;
}

// The collective's body on the stream's worker.
void runOnWorker(ncclComm& c, const CollectiveCall& call, const char* what) {
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.released) return;  // aborted: the kernel exits at once
  }
  if (!enterExclusive(c, what)) return;
  bool block;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    block = c.broken || hangRequested();
    if (block) c.broken = true;  // later collectives queue behind this one and never complete either
  }
  if (!block && c.nranks == 1) {
    // The kernel's duration, so that a collective of this communicator on another stream overlaps it.
    int ms;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      ms = randomMs(c, 0, 2);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + 1000 * ms));
    // One rank: every reduction of one contribution is itself (AVG too), broadcast is from rank 0.
    const size_t bytes = oneRankAvgWritten(call, typeBytes(call.type)) * typeBytes(call.type);
    if (bytes && call.send != call.recv) std::memmove(call.recv, call.send, bytes);
  } else if (!block) {
    std::string why;
    const Exchange e = c.shared->run(call, &why);
    if (e == Exchange::Hung) {
      std::fprintf(stderr, "emulator: %s on cuda:%d: %s; it hangs, as NCCL's would, until the communicator is "
                           "aborted\n", what, c.dev, why.c_str());
      block = true;
    } else if (e == Exchange::Failed) {
      std::lock_guard<std::mutex> lock(c.mu);
      setAsyncError(c, c.shared->mismatch() ? ncclInvalidUsage : ncclRemoteError, why);
      block = true;
    }
    if (block) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.broken = true;
    }
  }
  if (block) blockUntilReleased(c);
  leaveExclusive(c);
}

// Puts the collective on `stream` (or into the graph it is capturing). Called by the caller's thread
// (blocking communicator) or the helper thread (non-blocking).
ncclResult_t enqueueOn(const CommPtr& c, const CollectiveCall& call, const char* what, cudaStream_t stream) {
  if (!stream) cudaSetDevice(c->dev);  // the legacy stream of the communicator's device
  const bool capturing = cxemu::isCapturing(stream);
  const size_t item = typeBytes(call.type);
  const size_t n = static_cast<size_t>(c->nranks);
  const size_t sendBytes = call.count * item * (call.kind == CollectiveKind::ReduceScatter ? n : 1);
  const size_t recvBytes = call.count * item * (call.kind == CollectiveKind::AllGather ? n : 1);
  std::vector<Access> accesses;
  if (call.count) accesses = {{call.send, sendBytes, false}, {call.recv, recvBytes, true}};
  std::shared_ptr<InFlight> flight = capturing ? nullptr : std::make_shared<InFlight>(c);
  CommPtr keep = c;  // queued or captured work keeps the communicator alive
  const cudaError_t e = cxemu::enqueue(stream, what, std::move(accesses), [keep, call, what, flight] {
    runOnWorker(*keep, call, what);
    if (flight) flight->done();
  });
  if (e != cudaSuccess) {
    return fail(ncclUnhandledCudaError, cat("Cuda failure '", cudaGetErrorString(e), "' enqueuing ", what));
  }
  if (capturing) cxemu::captureAddHold(stream, c.get());  // the graph holds the communicator
  return ncclSuccess;
}

ncclResult_t collective(const CollectiveCall& call, ncclComm_t handle, cudaStream_t stream) {
  const char* what = collectiveName(call.kind);
  CommPtr c = lookup(handle);
  if (!c) return fail(ncclInvalidArgument, cat(what, ": emulator: not a live communicator"));
  const size_t item = typeBytes(call.type);
  if (!item) return fail(ncclInvalidArgument, cat(what, ": invalid type ", int(call.type)));
  if (call.op < 0 || call.op >= ncclNumOps) return fail(ncclInvalidArgument, cat(what, ": invalid op ", int(call.op)));
  if (call.kind == CollectiveKind::Broadcast && (call.root < 0 || call.root >= c->nranks)) {
    return fail(ncclInvalidArgument, cat(what, ": invalid root ", call.root, " (root should be in the 0..",
                                         c->nranks - 1, " range)"));
  }
  if (c->nranks > 1 && !elemBytes(call.type)) {
    return fail(ncclInvalidArgument, cat(what, ": emulator: data type ", int(call.type),
                                         " is not emulated between ranks (int32, int64, float16, bfloat16, float32, float64 are)"));
  }
  if (call.count) {
    const size_t n = static_cast<size_t>(c->nranks);
    const size_t sendBytes = call.count * item * (call.kind == CollectiveKind::ReduceScatter ? n : 1);
    const size_t recvBytes = call.count * item * (call.kind == CollectiveKind::AllGather ? n : 1);
    if (!cxemu::isDeviceRange(call.send, sendBytes, c->dev)) {
      return fail(ncclInvalidArgument, cat(what, " : sendbuff is not ", sendBytes, " bytes of device memory of cuda:",
                                           c->dev, " (emulator)"));
    }
    if (!cxemu::isDeviceRange(call.recv, recvBytes, c->dev)) {
      return fail(ncclInvalidArgument, cat(what, " : recvbuff is not ", recvBytes, " bytes of device memory of cuda:",
                                           c->dev, " (emulator)"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (ncclResult_t r = ensureReadyLocked(*c, groupDepth_ > 0); r != ncclSuccess) return r;
    if (c->finalizing) return fail(ncclInvalidUsage, cat(what, ": emulator: the communicator is finalized"));
    if (!c->blocking) ++c->deferred;
  }
  if (c->blocking) return enqueueOn(c, call, what, stream);
  // Non-blocking: in progress for a few ms, then enqueued. An event recorded on `stream` before
  // ncclCommGetAsyncError reports ncclSuccess does not follow the collective.
  std::weak_ptr<ncclComm> weak = c;
  defer(*c, 1, 4, [weak, call, what, stream] {
    CommPtr k = weak.lock();
    if (!k) return;
    const ncclResult_t r = enqueueOn(k, call, what, stream);
    std::lock_guard<std::mutex> lock(k->mu);
    if (k->deferred > 0) --k->deferred;
    if (r != ncclSuccess) setAsyncError(*k, r, cat(what, ": the deferred enqueue failed"));
    k->cv.notify_all();
  });
  if (groupDepth_ > 0) {
    groupDeferred_ = true;
    return ncclSuccess;  // the group's ncclGroupEnd reports ncclInProgress
  }
  return ncclInProgress;
}

}  // namespace

int groupDepth() { return groupDepth_; }

}  // namespace cxemu::nccl

using cxemu::nccl::CollectiveCall;
using cxemu::nccl::CollectiveKind;

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return cxemu::nccl::collective({CollectiveKind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0}, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return cxemu::nccl::collective({CollectiveKind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root}, comm,
                                 stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return cxemu::nccl::collective({CollectiveKind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0}, comm,
                                 stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return cxemu::nccl::collective({CollectiveKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, comm,
                                 stream);
}

ncclResult_t ncclGroupStart(void) {
  ++cxemu::nccl::groupDepth_;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  using namespace cxemu::nccl;
  if (groupDepth_ == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call");
  if (--groupDepth_ > 0 || !groupDeferred_) return ncclSuccess;
  groupDeferred_ = false;
  return ncclInProgress;
}

// Test hook: how many times two collectives of one communicator overlapped on different streams.
__attribute__((visibility("default"))) int cxemu_test_nccl_misuse() { return cxemu::nccl::misuses.load(); }

}  // extern "C"
