// NCCL communicators, non-blocking (config.blocking = 0): init and collectives may return
// ncclInProgress, and the caller polls ncclState, so a dead peer surfaces as an error instead of a
// hang the caller cannot interrupt.
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

// "ncclAllReduce on cuda:0 failed: unhandled system error (<NCCL's last message>)"
Status ncclFailure(const char* call, int dev, ncclResult_t r, ncclComm_t comm) {
  Status s = callOn(call, dev) + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

bool accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

bool ncclTypeOf(ElemType t, ncclDataType_t* out) {
  switch (t) {
    case ElemType::Float32: *out = ncclFloat32; return true;
    case ElemType::Float64: *out = ncclFloat64; return true;
    case ElemType::Int32: *out = ncclInt32; return true;
    case ElemType::Int64: *out = ncclInt64; return true;
    case ElemType::Float16: *out = ncclFloat16; return true;    // NCCL reduces these itself
    case ElemType::BFloat16: *out = ncclBfloat16; return true;
  }
  return false;
}

bool ncclOpOf(ReduceKind k, ncclRedOp_t* out) {
  switch (k) {
    case ReduceKind::Sum: *out = ncclSum; return true;
    case ReduceKind::Avg: *out = ncclAvg; return true;
    case ReduceKind::Max: *out = ncclMax; return true;
    case ReduceKind::Min: *out = ncclMin; return true;
    case ReduceKind::Product: *out = ncclProd; return true;
  }
  return false;
}

}  // namespace

Status ApiImpl::ncclUniqueId(std::string* id) noexcept {
  ::ncclUniqueId uid;  // qualified: inside ApiImpl the name is the member function
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) return ncclFailure("ncclGetUniqueId", -1, r, nullptr);
  id->assign(uid.internal, NCCL_UNIQUE_ID_BYTES);
  return {};
}

Status ApiImpl::ncclInit(int dev, int nranks, int rank, const std::string& id, void** comm) noexcept {
  *comm = nullptr;
  if (id.size() != NCCL_UNIQUE_ID_BYTES) {
    return "ncclInit on cuda:" + std::to_string(dev) + ": the NCCL unique id has " + std::to_string(id.size()) +
           " bytes, expected " + std::to_string(NCCL_UNIQUE_ID_BYTES);
  }
  // The streams first, so that creating them never races the communicator's setup on this device.
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  ::ncclUniqueId uid;  // qualified: inside ApiImpl the name is the member function
  std::memcpy(uid.internal, id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&c, nranks, uid, rank, &cfg);
  if (!accepted(r)) {
    Status st = ncclFailure("ncclCommInitRankConfig", dev, r, c);
    if (c) ncclCommAbort(c);
    return st;
  }
  *comm = c;
  return {};
}

Status ApiImpl::ncclState(void* comm, bool* inProgress) noexcept {
  *inProgress = false;
  auto c = static_cast<ncclComm_t>(comm);
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(c, &st);
  if (r != ncclSuccess) return ncclFailure("ncclCommGetAsyncError", -1, r, c);
  if (st == ncclInProgress) {
    *inProgress = true;
    return {};
  }
  if (st != ncclSuccess) return ncclFailure("the NCCL communicator", -1, st, c);
  return {};
}

Status ApiImpl::ncclCollective(void* comm, int dev, CollectiveKind kind, const void* send, void* recv, size_t count,
                               ElemType type, ReduceKind op, int root) noexcept {
  ncclDataType_t t;
  ncclRedOp_t o;
  if (!ncclTypeOf(type, &t)) return "ncclCollective: unknown ElemType " + std::to_string(int(type));
  if (!ncclOpOf(op, &o)) return "ncclCollective: unknown ReduceKind " + std::to_string(int(op));
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  auto c = static_cast<ncclComm_t>(comm);
  ncclResult_t r;
  const char* call;
  switch (kind) {
    case CollectiveKind::AllReduce:
      call = "ncclAllReduce";
      r = ::ncclAllReduce(send, recv, count, t, o, c, s->comm);
      break;
    case CollectiveKind::Broadcast:
      call = "ncclBroadcast";
      r = ::ncclBroadcast(send, recv, count, t, root, c, s->comm);
      break;
    case CollectiveKind::AllGather:
      call = "ncclAllGather";
      r = ::ncclAllGather(send, recv, count, t, c, s->comm);
      break;
    case CollectiveKind::ReduceScatter:
      call = "ncclReduceScatter";
      r = ::ncclReduceScatter(send, recv, count, t, o, c, s->comm);
      break;
    default:
      return "ncclCollective: unknown CollectiveKind " + std::to_string(int(kind));
  }
  if (!accepted(r)) return ncclFailure(call, dev, r, c);
  return {};
}

void ApiImpl::ncclAbort(void* comm) noexcept {
  if (comm) ::ncclCommAbort(static_cast<ncclComm_t>(comm));
}

void ApiImpl::ncclDestroy(void* comm) noexcept {
  if (!comm) return;
  auto c = static_cast<ncclComm_t>(comm);
  // Finalize flushes outstanding work and is a collective over the ranks; a rank that never
  // arrives must not hang us forever, so give it a bounded time and abort otherwise.
  ncclResult_t st = ::ncclCommFinalize(c);
  if (accepted(st)) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      if (::ncclCommGetAsyncError(c, &st) != ncclSuccess) {
        st = ncclInternalError;
        break;
      }
      if (st != ncclInProgress || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (st == ncclSuccess) {
    ::ncclCommDestroy(c);
  } else {
    ::ncclCommAbort(c);
  }
}

}  // namespace cyxwiz::cuda
