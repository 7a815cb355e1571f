#include "cyxwiz/comm/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>

#include "cyxwiz/comm/hierarchical.h"
#include "cyxwiz/comm/reduce.h"
#include "cyxwiz/comm/shm/topology.h"
#include "cyxwiz/comm/ring.h"
#include "cyxwiz/comm/shm/links.h"
#include "cyxwiz/comm/shm/window.h"
#include "cyxwiz/comm/tcp/links.h"
#include "cyxwiz/comm/tcp/rendezvous.h"
#include "cyxwiz/comm/window_collectives.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::cpu {

// The TCP transport (comm/tcp/): rendezvous, ring links, the monitor, the store.
using tcp::butterflyPartners;
using tcp::connectRing;
using tcp::firstExternalIp;
using tcp::HostRing;
using tcp::isLoopbackAddress;
using tcp::Monitor;
using tcp::Pair;
using tcp::PointToPoint;
using tcp::RingLinks;
using tcp::StoreServer;
using tcp::TcpStore;

namespace {

ErrorKind kindOf(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError&) {
    return ErrorKind::Timeout;
  } catch (const NetworkError&) {
    return ErrorKind::Network;
  } catch (const Interrupted&) {
    return ErrorKind::Network;  // this rank is going away
  } catch (...) {
    return ErrorKind::Backend;
  }
}

std::string messageOf(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

namespace {

// How long a blocking call polls before it sleeps: CYXWIZ_SPIN_US, else 2 ms when this machine has
// a core for every local rank (a sleeping rank wakes 20-100 us late on a busy host), else 0.
std::chrono::microseconds spinBudget(const DistributedConfig& config) {
  if (config.spinUs >= 0) return std::chrono::microseconds(config.spinUs);
  long ranksHere = ranksOnThisHost(config);
  long cores = static_cast<long>(std::thread::hardware_concurrency());
  return std::chrono::microseconds(ranksHere > 0 && ranksHere <= cores ? 2000 : 0);
}

// The communication thread runs beside the caller's computation (async calls, DDP buckets): it
// spins only briefly, so as not to take a core from it.
constexpr std::chrono::microseconds kMaxAsyncSpin{50};

// The address other ranks reach this one on: the interface that reaches rank 0. When MASTER_ADDR is
// a name that resolves to loopback here (Debian maps the host's own name to 127.0.1.1), that would
// be unreachable from other machines: publish an external interface instead.
std::string publishedIp(const DistributedConfig& config, const std::string& viaMaster) {
  const std::string& m = config.masterAddr;
  if (!isLoopbackAddress(viaMaster) || isLoopbackAddress(m) || m == "localhost" || m == "::1") return viaMaster;
  std::string external = firstExternalIp();
  if (external.empty()) return viaMaster;
  logInfo(makeString("init: MASTER_ADDR '", m, "' resolves to ", viaMaster, " on this machine; publishing ", external,
                     " so that ranks on other machines can reach this one"));
  return external;
}

}  // namespace

void CpuBackend::requireCpu(const Tensor& t, const char* what) {
  CYX_CHECK(t.defined(), what, ": no array given");
  CYX_CHECK(t.device().type == DeviceType::CPU, what, ": the cpu backend needs host memory");
}

CpuBackend::CpuBackend(const DistributedConfig& config, const std::function<void(int)>& servedOn)
    : Backend(config), spin_(spinBudget(config)) {
  if (config.worldSize > 1) {
    Deadline deadline = deadlineAfterMs(config.timeoutMs);
    if (config.rank == 0) {
      server_ = std::make_unique<StoreServer>(config_);
      // masterPort 0: the server took a free port, which the others learn from whoever gave them
      // this config (servedOn: another framework's store, pycyxwiz.torch).
      config_.masterPort = server_->port();
      if (servedOn) servedOn(config_.masterPort);
    }
    try {
      store_ = std::make_unique<TcpStore>(config_, deadline);
      monitor_ = std::make_unique<Monitor>(config_, deadline);
      shm::publishHost(config_, *store_, deadline);
      shm::Hosts hosts;
      // Links between hosts open with the ring, in case the hosts prove able to share memory.
      auto hostRing = [&] {
        hosts = shm::readHosts(config_, *store_, deadline);
        HostRing ring;
        if (hosts.hierarchical() && hosts.transport != "tcp") {
          ring.left = hosts.at((hosts.host + hosts.count() - 1) % hosts.count(), hosts.local);
          ring.right = hosts.at((hosts.host + 1) % hosts.count(), hosts.local);
          for (int h : butterflyPartners(hosts.host, hosts.count())) ring.partners.push_back(hosts.at(h, hosts.local));
        }
        return ring;
      };
      RingLinks links = connectRing(config_, *store_, publishedIp(config_, store_->localIp()), deadline, hostRing);
      left_ = std::move(links.left);
      right_ = std::move(links.right);
      partners_ = std::move(links.partners);
      hostLeft_ = std::move(links.hostLeft);
      hostRight_ = std::move(links.hostRight);
      hostPartners_ = std::move(links.hostPartners);
      std::vector<std::string> addresses = links.addresses;
      p2p_ = std::make_unique<PointToPoint>(config_, std::move(links.gate), std::move(links.addresses));
      for (Pair* p : allLinks()) p->socket.setLiveness(config.timeoutMs);
      std::string whyNot;
      shm_ = shm::formGroup(config_, *store_, hosts, deadline, &whyNot);
      if (shm_) shm_->addresses = std::move(addresses);
      if (shm_ && hosts.count() > 1) host_ = hosts.host, hosts_ = hosts.count();
      shmRing_ = config_.shmAlgorithm == "ring";
      if (!shm_) {
        hostLeft_.socket.close();  // unused: every collective takes the flat ring
        hostRight_.socket.close();
        hostPartners_.clear();
      }
      config_.transport = !shm_ ? "tcp" : hosts_ > 1 ? "shm+tcp" : "shm";
      if (!shm_ && config_.rank == 0) logDebug(makeString("init: transport tcp: ", whyNot));
    } catch (...) {
      failRendezvous(std::current_exception());
    }
  }
  worker_ = std::thread([this] { workerLoop(); });
  // Every rank leaves init only once the whole ring has carried a message.
  try {
    barrier(false)->wait();
  } catch (...) {
    shutdown();
    throw;
  }
  logDebug(makeString("init: connected: ", config_.describe()));
}

CpuBackend::~CpuBackend() { shutdown(); }

void CpuBackend::failRendezvous(std::exception_ptr error) {
  if (!monitor_) std::rethrow_exception(error);
  // A lost store usually means rank 0 gave up and said why on the monitor: report that cause.
  if (kindOf(error) == ErrorKind::Network) {
    if (auto failure = monitor_->waitForNotice(deadlineAfterMs(1000))) {
      raiseFailure(failure->kind, makeString(rankPrefix(), "init: ", noticeText(*failure)));
    }
  }
  monitor_->report(kindOf(error), messageOf(error));
  std::rethrow_exception(error);
}

std::shared_ptr<Work> CpuBackend::submit(CallSignature call, bool async, std::function<void(Collectives&)> body) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (broken_) std::rethrow_exception(broken_);
  if (closed_) throw DistError(makeString(rankPrefix(), collectiveName(call.collective), ": the process group was finalized; call init() again first"));
  call.sequence = ++sequence_;
  Task task{call, std::move(body), std::make_shared<Work>(call, config_.rank, config_.worldSize)};
  auto work = task.work;
  if (async) {
    queue_.push_back(std::move(task));
    changed_.notify_all();
    return work;
  }
  // Work issued earlier runs first; then this call runs here, with no hand-off to another thread.
  ++waiters_;
  changed_.wait(lock, [this] { return closed_ || (queue_.empty() && !busy_); });
  --waiters_;
  if (closed_) throw NetworkError(makeString(task.work->description(), ": finalize() was called on another thread before this call could start"));
  runLocked(lock, task, true);
  return work;
}

void CpuBackend::runLocked(std::unique_lock<std::mutex>& lock, Task& task, bool onCaller) {
  busy_ = true;
  lock.unlock();
  execute(task, onCaller);
  lock.lock();
  busy_ = false;
  // Wake only someone with something to do: an idle worker woken after every blocking call costs a
  // context switch per call, about half the latency of a 4 KiB all-reduce on a busy host.
  if (!queue_.empty() || stopping_ || waiters_ > 0) changed_.notify_all();
}

// The body goes (task.body = nullptr) before the work is finished, and never under mutex_: its
// captures may hold the last reference to a caller's buffer (a numpy array, released through
// bindings/gil.h), so whoever waits for the work finds it released, and nothing that runs when it
// goes can wait for this backend's lock.
void CpuBackend::execute(Task& task, bool onCaller) {
  std::exception_ptr broken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    broken = broken_;
  }
  if (broken) {
    task.body = nullptr;
    return task.work->finish(broken);
  }
  try {
    const auto spin = onCaller ? spin_ : std::min(spin_, kMaxAsyncSpin);
    const auto interrupted = onCaller ? interruptCheck() : nullptr;
    const Deadline deadline = deadlineAfterMs(config_.timeoutMs);
    const auto slice = static_cast<size_t>(config_.ringSliceBytes);
    if (!shm_) {
      tcp::Links links(config_.rank, config_.worldSize, &left_, &right_, &partners_, monitor_.get(), deadline,
                       config_.timeoutMs, *task.work, spin, interrupted, &finalizing_);
      Ring ring(links, scratch_, task.call, slice);
      task.body(ring);
    } else {
      // This host's ranks, in shared memory: by CYXWIZ_SHM_ALGORITHM, reading each other's memory
      // directly, or the ring's algorithms over the segment. Only the one used is built (per call).
      shm::Window window(*shm_, task.call, monitor_.get(), config_.timeoutMs, *task.work, spin, interrupted,
                         &finalizing_);
      auto onHost = [&](Collectives& local) {
        if (hosts_ == 1) return task.body(local);
        tcp::Links links(config_.rank, config_.worldSize, &left_, &right_, &partners_, monitor_.get(), deadline,
                         config_.timeoutMs, *task.work, spin, interrupted, &finalizing_);
        Ring ring(links, scratch_, task.call, slice);
        tcp::Links acrossLinks(host_, hosts_, &hostLeft_, &hostRight_, &hostPartners_, monitor_.get(), deadline,
                               config_.timeoutMs, *task.work, spin, interrupted, &finalizing_);
        Ring across(acrossLinks, scratch_, task.call, slice);
        Hierarchical hierarchical(local, across, ring, shm_->size(), shm_->me(), config_.worldSize,
                                  WindowCollectives::kSmallBytes);
        task.body(hierarchical);
      };
      if (shmRing_) {
        shm::Links links(window);
        Ring ring(links, scratch_, task.call, slice);
        onHost(ring);
      } else {
        WindowCollectives direct(window, task.call);
        onHost(direct);
      }
    }
    task.body = nullptr;
    task.work->finish();
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      broken_ = error;
    }
    // Tell the job first, so that every rank stops with this cause rather than a lost connection.
    if (monitor_) {
      monitor_->report(kindOf(error), messageOf(error));
      // A timeout comes back from rank 0 with a verdict naming the rank that never reported.
      if (kindOf(error) == ErrorKind::Timeout) {
        if (auto verdict = monitor_->waitForNotice(deadlineAfterMs(2000))) {
          std::string text = verdict->origin == config_.rank ? verdict->message
                                                             : task.work->description() + ": " + noticeText(*verdict);
          try {
            raiseFailure(verdict->kind, text);
          } catch (...) {
            error = std::current_exception();
          }
          std::lock_guard<std::mutex> lock(mutex_);
          broken_ = error;
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);  // shutdown() may be shutting them down on another thread
      closeLinks();
    }
    task.body = nullptr;  // outside the lock: dropping it may release arrays (bindings/gil.h)
    task.work->finish(error);
  }
}

void CpuBackend::workerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return (stopping_ && queue_.empty()) || (!queue_.empty() && !busy_); });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    runLocked(lock, task, false);
  }
}

void CpuBackend::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();  // queued collectives finish (each within the timeout)
  if (shm_) shm_->leave();  // peers still waiting for us in shared memory stop now, naming us
  // A blocking call on another caller thread may still be using the links. Shut them down (it fails
  // at once, saying finalize stopped it) and let it leave before closing them: closed under it, a
  // descriptor number could be reused by the next socket or file this process opens.
  bool inFlight = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (busy_) {
      finalizing_ = true;
      for (Pair* p : allLinks()) p->socket.shutdownBoth();
      inFlight = !changed_.wait_for(lock, std::chrono::seconds(5), [this] { return !busy_; });
    }
  }
  // Sends still queued get the timeout to leave; recvs still waiting fail.
  if (p2p_) p2p_->shutdown(deadlineAfterMs(config_.timeoutMs));
  if (inFlight) {
    // Still inside after 5 s: leave its sockets (and the monitor) to it; they close with the backend.
    logWarning("finalize: a collective on another thread has not returned; its connections close when it does");
  } else {
    if (monitor_) monitor_->goodbye();
    closeLinks();
  }
  store_.reset();
  if (server_) server_->stop();
}

std::vector<Pair*> CpuBackend::allLinks() {
  std::vector<Pair*> all{&left_, &right_, &hostLeft_, &hostRight_};
  for (Pair& p : partners_) all.push_back(&p);
  for (Pair& p : hostPartners_) all.push_back(&p);
  return all;
}

void CpuBackend::closeLinks() {
  for (Pair* p : allLinks()) p->socket.close();
}

std::shared_ptr<Work> CpuBackend::staged(const CallSignature& call, const Tensor& in, const Tensor& out,
                                         const std::function<void(const Tensor&, const Tensor&)>& collective) {
  auto lock = staging_.lock();
  Tensor hostIn = staging_.host(0, in);
  hostIn.copyFrom(in);
  const bool same = in.sharesStorageWith(out) && in.rawData() == out.rawData();
  Tensor hostOut = same ? hostIn : staging_.host(1, out);
  collective(hostIn, hostOut);
  Tensor(out).copyFrom(hostOut);
  auto work = std::make_shared<Work>(call, config_.rank, config_.worldSize);
  work->finish();
  return work;
}

CallSignature CpuBackend::onBuffer(Collective c, const Tensor& data, ReduceOp op) const {
  CallSignature call = callSignature(c, data, op);
  if (shm_) call.buffer = shm_->buffers.find(data.rawData(), data.nbytes(), shm_->me());
  return call;
}

std::shared_ptr<Work> CpuBackend::allReduce(const Tensor& data, ReduceOp op, bool async) {
  if (data.isCuda()) {
    return staged(callSignature(Collective::AllReduce, data, op), data, data,
                  [&](const Tensor& h, const Tensor&) { allReduce(h, op, false)->wait(); });
  }
  requireCpu(data, "all_reduce");
  checkReduceOp(op, data.dtype(), "all_reduce");
  return submit(onBuffer(Collective::AllReduce, data, op), async, [data, op](Collectives& ring) {
    ring.allReduce(data.rawData(), static_cast<size_t>(data.numel()), data.dtype(), op);
  });
}

Tensor CpuBackend::sharedZeros(int64_t elements, DType dtype) {
  // Only the direct algorithms on one host read shared buffers where they lie.
  if (!shm_ || hosts_ != 1 || shmRing_ || elements <= 0) return Backend::sharedZeros(elements, dtype);
  CallSignature call;
  call.collective = Collective::ShareBuffer;
  call.dtype = dtype;
  call.count = static_cast<uint64_t>(elements);
  std::shared_ptr<shm::SharedBuffer> buffer;
  std::string why;
  const size_t bytes = static_cast<size_t>(elements) * itemSize(dtype);
  submit(call, false, [&](Collectives& local) {
    buffer = shm_->buffers.make(local, shm_->size(), shm_->me(), bytes, &why);
  })->wait();
  if (!buffer) {
    logInfo(makeString("a buffer of ", bytes, " bytes stays in private memory (all_reduce copies it "
                       "through the shared slots): ", why));
    return Backend::sharedZeros(elements, dtype);
  }
  uint8_t* data = buffer->segments[static_cast<size_t>(shm_->me())].data();
  return Tensor::fromExternal(data, {elements}, dtype, std::move(buffer));
}

std::shared_ptr<Work> CpuBackend::broadcast(const Tensor& data, int src, bool async) {
  if (data.isCuda()) {
    return staged(callSignature(Collective::Broadcast, data, ReduceOp::Sum, src), data, data,
                  [&](const Tensor& h, const Tensor&) { broadcast(h, src, false)->wait(); });
  }
  requireCpu(data, "broadcast");
  CYX_CHECK(src >= 0 && src < config_.worldSize, "broadcast: src=", src, " is not a rank: expected 0..", config_.worldSize - 1);
  return submit(callSignature(Collective::Broadcast, data, ReduceOp::Sum, src), async,
                [data, src](Collectives& ring) { ring.broadcast(data.rawData(), data.nbytes(), src); });
}

std::shared_ptr<Work> CpuBackend::allGather(const Tensor& in, const Tensor& out, bool async) {
  if (in.isCuda() || out.isCuda()) {
    return staged(callSignature(Collective::AllGather, in), in, out,
                  [&](const Tensor& h, const Tensor& o) { allGather(h, o, false)->wait(); });
  }
  requireCpu(in, "all_gather");
  requireCpu(out, "all_gather");
  CYX_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * config_.worldSize,
            "all_gather: the output must hold world_size x ", in.numel(), " elements of ", dtypeName(in.dtype()));
  return submit(callSignature(Collective::AllGather, in), async,
                [in, out](Collectives& ring) { ring.allGather(in.rawData(), out.rawData(), in.nbytes()); });
}

std::shared_ptr<Work> CpuBackend::reduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) {
  if (in.isCuda() || out.isCuda()) {
    return staged(callSignature(Collective::ReduceScatter, in, op), in, out,
                  [&](const Tensor& h, const Tensor& o) { reduceScatter(h, o, op, false)->wait(); });
  }
  requireCpu(in, "reduce_scatter");
  requireCpu(out, "reduce_scatter");
  checkReduceOp(op, in.dtype(), "reduce_scatter");
  size_t count = static_cast<size_t>(in.numel());
  size_t part = partBegin(count, config_.worldSize, config_.rank + 1) - partBegin(count, config_.worldSize, config_.rank);
  CYX_CHECK(out.dtype() == in.dtype() && static_cast<size_t>(out.numel()) == part,
            "reduce_scatter: the output must hold this rank's part, ", part, " elements of ", dtypeName(in.dtype()));
  return submit(callSignature(Collective::ReduceScatter, in, op), async, [in, out, op, count](Collectives& ring) {
    ring.reduceScatter(in.rawData(), out.rawData(), count, in.dtype(), op);
  });
}

std::shared_ptr<Work> CpuBackend::reduceScatterInPlace(const Tensor& data, ReduceOp op, bool async) {
  if (data.isCuda()) {
    return staged(callSignature(Collective::ReduceScatterInPlace, data, op), data, data,
                  [&](const Tensor& h, const Tensor&) { reduceScatterInPlace(h, op, false)->wait(); });
  }
  requireCpu(data, "reduce_scatter");
  checkReduceOp(op, data.dtype(), "reduce_scatter");
  return submit(onBuffer(Collective::ReduceScatterInPlace, data, op), async, [data, op](Collectives& ring) {
    ring.reduceScatterInPlace(data.rawData(), static_cast<size_t>(data.numel()), data.dtype(), op);
  });
}

std::shared_ptr<Work> CpuBackend::allGatherInPlace(const Tensor& data, bool async) {
  if (data.isCuda()) {
    return staged(callSignature(Collective::AllGatherInPlace, data), data, data,
                  [&](const Tensor& h, const Tensor&) { allGatherInPlace(h, false)->wait(); });
  }
  requireCpu(data, "all_gather");
  return submit(onBuffer(Collective::AllGatherInPlace, data), async, [data](Collectives& ring) {
    ring.allGatherInPlace(data.rawData(), static_cast<size_t>(data.numel()), data.dtype());
  });
}

bool CpuBackend::reducesRounded(const Tensor& data) const {
  // WindowCollectives::allReduceRounded's conditions: the direct algorithms on one host, a float32 buffer
  // every rank maps, larger than a half (smaller ones go through the halves, as 16-bit copies).
  return shm_ && hosts_ == 1 && !shmRing_ && !data.isCuda() && data.dtype() == DType::Float32 &&
         data.nbytes() > shm_->halfBytes() && shm_->buffers.find(data.rawData(), data.nbytes(), shm_->me()) != 0;
}

std::shared_ptr<Work> CpuBackend::allReduceRounded(const Tensor& data, DType wire, float scale, ReduceOp op,
                                                   bool partial, bool async) {
  CYX_CHECK(reducesRounded(data) && (wire == DType::BFloat16 || wire == DType::Float16) &&
                (op == ReduceOp::Sum || op == ReduceOp::Avg),
            rankPrefix(), "all_reduce (16-bit, rounded in place): not offered for this buffer (an engine bug)");
  CallSignature call = onBuffer(partial ? Collective::ReduceScatterRounded : Collective::AllReduceRounded, data, op);
  call.dtype = wire;  // what the ranks must agree on; the data are float32
  return submit(call, async, [data, wire, scale, op, partial](Collectives& local) {
    local.allReduceRounded(data.data<float>(), static_cast<size_t>(data.numel()), wire, scale, op, partial);
  });
}

bool CpuBackend::reducesForStep(const Tensor& data) const {
  return reducesRounded(data);  // WindowCollectives::reduceForStep's conditions are the same
}

void CpuBackend::reduceForStep(const Tensor& data, ReduceOp op, bool partial, DType wire, float scale,
                               const Collectives::StepConsumer& consume) {
  CYX_CHECK(reducesForStep(data) && (op == ReduceOp::Sum || op == ReduceOp::Avg) &&
                (wire == DType::Float32 || wire == DType::BFloat16 || wire == DType::Float16),
            rankPrefix(), "all_reduce (read by the optimizer step): not offered for this buffer (an engine bug)");
  CallSignature call = onBuffer(partial ? Collective::ReduceScatterForStep : Collective::AllReduceForStep, data, op);
  call.dtype = wire;  // what the ranks must agree on; the data are float32
  // On this thread: the consumer is the caller's optimizer step.
  submit(call, false, [&data, op, partial, wire, scale, &consume](Collectives& local) {
    local.reduceForStep(data.data<float>(), static_cast<size_t>(data.numel()), op, partial, wire, scale, consume);
  })->wait();
}

std::shared_ptr<Work> CpuBackend::barrier(bool async) {
  return submit(callSignature(Collective::Barrier, Tensor()), async, [](Collectives& ring) { ring.barrier(); });
}

}  // namespace cyxwiz::comm::cpu
