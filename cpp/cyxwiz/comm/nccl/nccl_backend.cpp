#include "cyxwiz/comm/nccl/nccl_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "cyxwiz/comm/cpu/cpu_backend.h"
#include "cyxwiz/comm/exchange.h"
#include "cyxwiz/comm/reduce.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/platform/process.h"

namespace cyxwiz::comm::nccl {

namespace {

// The CUDA library's ElemType (a fixed ABI) has the first six DType codes, and only those. NCCL
// reduces float16 and bfloat16 itself (DDP's 16-bit gradient exchange, ddp/wire.h).
bool hasElemType(DType d) {
  switch (d) {
    case DType::Float32: case DType::Float64: case DType::Int32: case DType::Int64: return true;
    case DType::Float16: case DType::BFloat16: return true;
    case DType::Int8: case DType::UInt8: case DType::Int16: case DType::Bool: return false;
  }
  return false;
}
cuda::ElemType elemType(DType d) { return static_cast<cuda::ElemType>(static_cast<int>(d)); }  // after hasElemType
// At world size 1 AVG is handed to NCCL as SUM: the same value (the sum of one contribution is
// itself), and NCCL before 2.29.7 left the tail of a one-rank float AVG unwritten (its one-rank
// kernel split the elements between blocks rounding down; NVIDIA/nccl#1950). SUM of one rank is a
// copy there, in every version.
cuda::ReduceKind reduceKind(ReduceOp op, int worldSize) {
  if (op == ReduceOp::Avg && worldSize == 1) op = ReduceOp::Sum;
  return static_cast<cuda::ReduceKind>(static_cast<int>(op));
}

// A collective's buffers while it may still run on the communication stream. Freeing them is
// stream-ordered on the compute stream, which does not wait for the communication stream: a Work
// dropped before its collective finished would let the next kernel reuse memory NCCL still reads or
// writes. So, unless the collective was seen to finish, the compute stream first waits for its
// event, and the buffers are released behind that wait (PyTorch's recordStream, in effect).
struct InFlight {
  InFlight(cuda::Api* api, int dev, std::shared_ptr<void> event, Tensor send, Tensor recv)
      : api(api), dev(dev), event(std::move(event)), send(std::move(send)), recv(std::move(recv)) {}
  ~InFlight() {
    if (!finished) api->computeWaitsFor(dev, event.get());  // errors: the backend reports them elsewhere
  }
  cuda::Api* api;
  int dev;
  std::shared_ptr<void> event;
  Tensor send, recv;
  bool finished = false;
};

}  // namespace

Device NcclBackend::deviceFor(const DistributedConfig& config) {
  std::string why;
  int count = device::cudaDeviceCount(&why);
  if (count == 0) {
    throw BackendError(makeString("init: the NCCL backend (DISTRIBUTED_BACKEND=nccl) needs a GPU on rank ", config.rank,
                                  ", but ", why, ". Use DISTRIBUTED_BACKEND=cpu (BackendType.CPU) to train on the CPU"));
  }
  if (config.localRank < count) return Device{DeviceType::CUDA, config.localRank};
  // Slurm's --gpus-per-task (or any per-rank CUDA_VISIBLE_DEVICES) shows each rank only its own GPUs
  // while LOCAL_RANK still counts the host's ranks; a real oversubscription is caught by checkDuplicateGpu.
  const int index = config.localRank % count;
  logInfo(makeString("LOCAL_RANK=", config.localRank, " but ", count, " GPU", count == 1 ? " is" : "s are",
                     " visible to this rank: using cuda:", index));
  return Device{DeviceType::CUDA, index};
}

NcclBackend::NcclBackend(const DistributedConfig& config, const Device& gpu, std::shared_ptr<cpu::CpuBackend> cpu)
    : Backend(config), cpu_(std::move(cpu)), device_(gpu) {
  try {
    api_ = &device::cudaApi();
    checkDuplicateGpu();
    // Rank 0's unique id reaches the others over the TCP ring.
    Tensor id = Tensor::zeros({128}, DType::Int32);  // 512 bytes >= NCCL_UNIQUE_ID_BYTES
    std::string mine;
    if (config.rank == 0) {
      device::check(api_->ncclUniqueId(&mine));
      CYX_CHECK(mine.size() <= id.nbytes(), "NCCL unique id of ", mine.size(), " bytes does not fit");
      std::memcpy(id.rawData(), mine.data(), mine.size());
    }
    cpu_->broadcast(id, 0, false)->wait();
    std::string uniqueId(static_cast<const char*>(id.rawData()), 128);  // NCCL_UNIQUE_ID_BYTES
    const auto deadline = Clock::now() + std::chrono::milliseconds(config.timeoutMs);
    cuda::Status s = api_->ncclInit(device_.index, config.worldSize, config.rank, uniqueId, &comm_);
    if (!s.empty()) fail("init: ncclCommInitRankConfig failed: " + s, false);
    awaitComm("init (NCCL communicator setup)", deadline);
    // Every communicator is up before anyone returns: a peer that failed its init fails the job here.
    cpu_->barrier(false)->wait();
  } catch (...) {
    shutdown();
    throw;
  }
  const int v = api_->ncclVersion();  // 23203 = 2.32.3
  logInfo(makeString("NCCL backend ready on ", device_.str(), " (NCCL ", v / 10000, ".", v / 100 % 100, ".", v % 100, ")"));
}

NcclBackend::~NcclBackend() { shutdown(); }

std::string NcclBackend::where() const {
  return makeString("rank ", config_.rank, "/", config_.worldSize, " on ", device_.str());
}

void NcclBackend::checkDuplicateGpu() {
  // Two ranks on one GPU: NCCL would fail later with "Duplicate GPU detected"; say who and why now.
  // The GPU is named by its UUID (and PCI bus id), not by hostname and index: containers share a
  // hostname with one GPU each, and CUDA_VISIBLE_DEVICES may name one GPU by index or by UUID.
  // Two hosts' GPUs never share a UUID, so the hostname only makes the message readable.
  cuda::DeviceProperties props;
  device::check(api_->deviceProperties(device_.index, &props));
  const std::string host = platform::hostName();
  const std::string key = props.uuid + "|" + props.pciBusId;
  std::vector<std::string> keys = allGatherStrings(*cpu_, key);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  for (int r = 0; r < config_.worldSize; ++r) {
    if (r != config_.rank && keys[static_cast<size_t>(r)] == key) {
      throw BackendError(makeString(
          "init: ranks ", std::min(r, config_.rank), " and ", std::max(r, config_.rank), " both use ", device_.str(),
          " (GPU ", props.uuid, ", PCI ", props.pciBusId, ") on host ", host, " (LOCAL_RANK=",
          config_.localRank, ", CUDA_VISIBLE_DEVICES=", visible ? visible : "<unset>",
          "): NCCL needs one GPU per rank. Give each rank its own LOCAL_RANK (torchrun and the launcher do), start no "
          "more ranks per host than GPUs, or use DISTRIBUTED_BACKEND=cpu to share a GPU"));
    }
  }
}

void NcclBackend::dropGraphs(bool wait) {
  // shutdown() waits for the replays, which takes mutex_ (awaitReplay); fail() runs under mutex_,
  // so it only tries: a concurrent shutdown() holding graphsMutex_ is dropping them already.
  std::unique_lock<std::mutex> lock(graphsMutex_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;
  }
  for (GraphHolder* holder : graphHolders_) holder->dropGraph(wait);
  graphHolders_.clear();
}

void NcclBackend::fail(const std::string& message, bool timeout) {
  std::string full = makeString("[", where(), "] ", message);
  dropGraphs(false);  // NCCL's abort waits for the graphs holding the communicator's collectives
  if (comm_) api_->ncclAbort(comm_);  // unblocks this rank's kernels; peers see the abort as an error
  comm_ = nullptr;
  std::exception_ptr error = timeout ? std::make_exception_ptr(TimeoutError(full))
                                     : std::make_exception_ptr(BackendError(full));
  if (!broken_) broken_ = error;
  std::rethrow_exception(error);
}

void NcclBackend::throwIfBroken() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_) std::rethrow_exception(broken_);
}

void NcclBackend::checkUsable(const char* what) {
  if (broken_) std::rethrow_exception(broken_);
  CYX_CHECK(comm_, what, ": the NCCL backend is shut down");
}

void NcclBackend::pollUntil(const std::string& what, Deadline deadline, const std::function<bool()>& done) {
  const auto start = Clock::now();
  auto lastInterruptCheck = start;
  for (;;) {
    if (done()) return;
    // A peer's failure shows up as the communicator's asynchronous error while we wait.
    bool inProgress = false;
    cuda::Status s = api_->ncclState(comm_, &inProgress);
    if (!s.empty()) fail(what + ": " + s, false);
    const auto now = Clock::now();
    if (now > deadline) {
      fail(makeString(what, " did not complete within DISTRIBUTED_TIMEOUT_MS=", config_.timeoutMs,
                      " ms: a peer rank is not taking part (stopped, crashed, or calling another collective). "
                      "The NCCL communicator was aborted; check the other ranks' output"),
           true);
    }
    if (now - lastInterruptCheck > std::chrono::milliseconds(100)) {
      lastInterruptCheck = now;
      throwIfInterrupted(what.c_str());
    }
    // Short naps while a collective may still be on time (a late wake-up delays the optimizer's
    // launch), long ones once it is clearly stuck.
    std::this_thread::sleep_for(now - start < std::chrono::milliseconds(20) ? std::chrono::microseconds(20)
                                                                           : std::chrono::microseconds(1000));
  }
}

void NcclBackend::awaitComm(const std::string& what, Deadline deadline) {
  pollUntil(what, deadline, [this, &what] {
    bool inProgress = false;
    cuda::Status s = api_->ncclState(comm_, &inProgress);
    if (!s.empty()) fail(what + ": " + s, false);
    return !inProgress;
  });
}

void NcclBackend::awaitEvent(void* event, const std::string& what, Deadline deadline) {
  pollUntil(what, deadline, [this, event, &what] {
    bool done = false;
    cuda::Status s = api_->eventQuery(event, &done);
    if (!s.empty()) fail(what + ": " + s, false);
    return done;
  });
}

void NcclBackend::awaitReplay(void* event, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  checkUsable(what.c_str());
  awaitEvent(event, what, Clock::now() + std::chrono::milliseconds(config_.timeoutMs));
}

std::shared_ptr<Work> NcclBackend::enqueue(CallSignature call, const Tensor& send, const Tensor& recv,
                                           cuda::CollectiveKind kind, bool async) {
  if (!hasElemType(call.dtype)) {
    throw TypeMismatch(makeString("[", where(), "] ", collectiveName(call.collective), ": the NCCL backend carries GPU "
                                  "tensors of float32, float64, float16, bfloat16, int32 and int64, got ",
                                  dtypeName(call.dtype), "; convert the tensor to one of those, or run this collective "
                                  "on host memory"));
  }
  std::unique_lock<std::mutex> lock(mutex_);
  checkUsable(collectiveName(call.collective));
  call.sequence = ++sequence_;
  auto work = std::make_shared<Work>(call, config_.rank, config_.worldSize);
  const std::string what = makeString(collectiveName(call.collective), " #", call.sequence, " (", dtypeName(call.dtype),
                                      ", ", call.count, " elements)");
  const auto deadline = Clock::now() + std::chrono::milliseconds(config_.timeoutMs);
  // The collective starts after the kernels that produced its input, on the communication stream.
  device::check(api_->commWaitsForCompute(device_.index));
  cuda::Status s = api_->ncclCollective(comm_, device_.index, kind, send.rawData(), recv.rawData(),
                                        static_cast<size_t>(kind == cuda::CollectiveKind::ReduceScatter ? recv.numel()
                                                                                                      : send.numel()),
                                        elemType(call.dtype), reduceKind(call.op, config_.worldSize),
                                        static_cast<int>(call.root));
  if (!s.empty()) fail(what + ": " + s, false);
  awaitComm(what, deadline);
  void* event = nullptr;
  device::check(api_->recordCommEvent(device_.index, &event));
  // The compute stream does not wait here, so the rest of backward overlaps the collective; wait()
  // sees the event complete on the host, and every kernel launched after that is ordered after it.
  lock.unlock();
  std::shared_ptr<void> holder(event, [api = api_](void* e) { api->eventRelease(e); });
  if (capturing_) {
    // Inside a graph: the kernels after wait() depend on the collective through the graph itself.
    work->setPoller([this, holder](bool) {
      device::check(api_->computeWaitsFor(device_.index, holder.get()));
      return true;
    });
    if (!async) work->wait();
    return work;
  }
  // Keep the tensors alive until the collective is done; a Work dropped before that hands them to
  // the compute stream only behind the collective's event (InFlight).
  auto inFlight = std::make_shared<InFlight>(api_, device_.index, holder, send, recv);
  work->setPoller([this, inFlight, what, deadline](bool block) {
    bool done = false;
    device::check(api_->eventQuery(inFlight->event.get(), &done));
    if (!done && block) {
      std::lock_guard<std::mutex> guard(mutex_);
      checkUsable(what.c_str());
      awaitEvent(inFlight->event.get(), what, deadline);
      done = true;
    }
    if (done) inFlight->finished = true;
    return done;
  });
  if (!async) work->wait();
  return work;
}

std::shared_ptr<Work> NcclBackend::allReduce(const Tensor& data, ReduceOp op, bool async) {
  throwIfBroken();
  if (!data.isCuda()) return cpu_->allReduce(data, op, async);
  checkReduceOp(op, data.dtype(), "all_reduce");
  return enqueue(callSignature(Collective::AllReduce, data, op), data, data, cuda::CollectiveKind::AllReduce, async);
}

std::shared_ptr<Work> NcclBackend::broadcast(const Tensor& data, int src, bool async) {
  throwIfBroken();
  if (!data.isCuda()) return cpu_->broadcast(data, src, async);
  CYX_CHECK(src >= 0 && src < config_.worldSize, "broadcast: src=", src, " is not a rank: expected 0..", config_.worldSize - 1);
  return enqueue(callSignature(Collective::Broadcast, data, ReduceOp::Sum, src), data, data, cuda::CollectiveKind::Broadcast,
                 async);
}

std::shared_ptr<Work> NcclBackend::onDevice(const Tensor& out,
                                            const std::function<std::shared_ptr<Work>(const Tensor&)>& run) {
  if (out.isCuda()) return run(out);
  // A host output (cx.distributed.all_gather of a GPU tensor returns numpy): gather on the device,
  // then copy out once the collective is done.
  Tensor staged = Tensor::empty(out.shape(), out.dtype(), device_);
  std::shared_ptr<Work> work = run(staged);
  work->wait();
  Tensor(out).copyFrom(staged);
  return work;
}

std::shared_ptr<Work> NcclBackend::allGather(const Tensor& in, const Tensor& out, bool async) {
  throwIfBroken();
  if (!in.isCuda() && !out.isCuda()) return cpu_->allGather(in, out, async);
  CYX_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * config_.worldSize,
            "all_gather: the output must hold world_size x ", in.numel(), " elements of ", dtypeName(in.dtype()));
  const Tensor send = in.to(device_);
  return onDevice(out, [&](const Tensor& recv) {
    return enqueue(callSignature(Collective::AllGather, in), send, recv, cuda::CollectiveKind::AllGather, async);
  });
}

std::shared_ptr<Work> NcclBackend::reduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) {
  throwIfBroken();
  if (!in.isCuda() && !out.isCuda()) return cpu_->reduceScatter(in, out, op, async);
  checkReduceOp(op, in.dtype(), "reduce_scatter");
  const int64_t n = in.numel(), world = config_.worldSize;
  // Parts as numpy.array_split makes them: the first n % world ranks hold one element more.
  const int64_t begin = config_.rank * (n / world) + std::min<int64_t>(config_.rank, n % world);
  const int64_t part = n / world + (config_.rank < n % world ? 1 : 0);
  CYX_CHECK(out.dtype() == in.dtype() && out.numel() == part, "reduce_scatter: the output must hold this rank's part, ",
            part, " elements of ", dtypeName(in.dtype()));
  const CallSignature call = callSignature(Collective::ReduceScatter, in, op);
  if (n % world == 0) {
    const Tensor send = in.to(device_);
    return onDevice(out, [&](const Tensor& recv) {
      return enqueue(call, send, recv, cuda::CollectiveKind::ReduceScatter, async);
    });
  }
  // NCCL needs equal parts: reduce everything, keep this rank's slice.
  Tensor reduced = in.isCuda() ? in.clone() : in.to(device_);
  enqueue(call, reduced, reduced, cuda::CollectiveKind::AllReduce, false);
  Tensor(out).copyFrom(reduced.view(begin, out.shape()));
  auto work = std::make_shared<Work>(call, config_.rank, config_.worldSize);
  work->finish();
  return work;
}

std::shared_ptr<Work> NcclBackend::barrier(bool async) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    checkUsable("barrier");
  }
  // Host-level and bounded by the timeout; device work queued before it is not waited for, as in c10d.
  return cpu_->barrier(async);
}

void NcclBackend::addGraphHolder(GraphHolder* holder) {
  std::lock_guard<std::mutex> lock(graphsMutex_);
  graphHolders_.push_back(holder);
}

void NcclBackend::removeGraphHolder(GraphHolder* holder) {
  std::lock_guard<std::mutex> lock(graphsMutex_);
  graphHolders_.erase(std::remove(graphHolders_.begin(), graphHolders_.end(), holder), graphHolders_.end());
}

void NcclBackend::computeWaitsForCollectives() {
  std::lock_guard<std::mutex> lock(mutex_);
  checkUsable("CUDA graph replay");
  void* event = nullptr;
  device::check(api_->recordCommEvent(device_.index, &event));
  cuda::Status s = api_->computeWaitsFor(device_.index, event);
  api_->eventRelease(event);
  device::check(s);
}

bool NcclBackend::allAgree(bool ok) {
  Tensor flag = Tensor::zeros({1}, DType::Int32);
  *static_cast<int32_t*>(flag.rawData()) = ok ? 1 : 0;
  cpu_->allReduce(flag, ReduceOp::Min, false)->wait();
  return *static_cast<const int32_t*>(flag.rawData()) == 1;
}

void NcclBackend::shutdown() {
  dropGraphs(true);  // NCCL's finalize waits for every graph holding our collectives
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_) {
    api_->ncclDestroy(comm_);
    comm_ = nullptr;
  }
  if (cpu_) cpu_->shutdown();
}

}  // namespace cyxwiz::comm::nccl
