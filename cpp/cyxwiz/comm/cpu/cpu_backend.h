// CpuBackend: collectives over TCP, a ring of connections between the ranks; over shared memory
// when every rank is on one host; hierarchical (shared memory inside hosts, rings between them) when
// the job spans hosts with the same number of ranks each (shm/topology.h).
//
// Construction is the rendezvous: rank 0 serves the store and the job monitor on MASTER_PORT,
// every rank connects to it, the ranks open their ring links, and a barrier proves the ring works.
//
// send/recv go their own way (tcp/p2p.h): links of their own, dialed on first use, and their own thread.
//
// Collectives run in issue order, one at a time, on a communication thread (async calls) or on the
// caller's thread when nothing is queued (blocking calls: no thread hand-off on the latency path).
// Each is bounded by the configured timeout. The first error breaks the backend: it is reported to
// the job monitor (so every other rank stops too), the ring is closed, and every later call fails
// at once with that original error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/cpu/staging.h"
#include "cyxwiz/comm/shm/group.h"
#include "cyxwiz/comm/tcp/monitor.h"
#include "cyxwiz/comm/tcp/p2p.h"
#include "cyxwiz/comm/tcp/pair.h"
#include "cyxwiz/comm/tcp/store_server.h"
#include "cyxwiz/comm/tcp/tcp_store.h"

namespace cyxwiz::comm::cpu {


class CpuBackend final : public Backend {
 public:
  // `servedOn` (rank 0 only): called with the port rank 0's rendezvous server listens on, once it
  // does and before anyone is waited for; with config.masterPort 0 that port is a free one.
  explicit CpuBackend(const DistributedConfig& config, const std::function<void(int)>& servedOn = {});
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  std::shared_ptr<Work> allReduce(const Tensor& data, ReduceOp op, bool async) override;
  Tensor sharedZeros(int64_t elements, DType dtype) override;
  std::shared_ptr<Work> broadcast(const Tensor& data, int src, bool async) override;
  std::shared_ptr<Work> allGather(const Tensor& in, const Tensor& out, bool async) override;
  std::shared_ptr<Work> reduceScatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) override;
  std::shared_ptr<Work> reduceScatterInPlace(const Tensor& data, ReduceOp op, bool async) override;
  std::shared_ptr<Work> allGatherInPlace(const Tensor& data, bool async) override;
  bool reducesRounded(const Tensor& data) const override;
  std::shared_ptr<Work> allReduceRounded(const Tensor& data, DType wire, float scale, ReduceOp op, bool partial,
                                         bool async) override;
  bool reducesForStep(const Tensor& data) const override;
  void reduceForStep(const Tensor& data, ReduceOp op, bool partial, DType wire, float scale,
                     const Collectives::StepConsumer& consume) override;
  std::shared_ptr<Work> barrier(bool async) override;
  // Over the point-to-point links, in issue order with the ring's collectives (peer_collectives.cpp).
  std::shared_ptr<Work> gather(const Tensor& in, const Tensor& out, int dst, bool async) override;
  std::shared_ptr<Work> scatter(const Tensor& in, const Tensor& out, int src, bool async) override;
  std::shared_ptr<Work> allToAll(const Tensor& in, const Tensor& out, const std::vector<int64_t>& inCounts,
                                 const std::vector<int64_t>& outCounts, bool async) override;
  std::shared_ptr<Work> send(const Tensor& data, int dst, int64_t tag) override;
  std::shared_ptr<Work> recv(const Tensor& data, int src, int64_t tag) override;
  void shutdown() override;

 private:
  struct Task {
    CallSignature call;
    std::function<void(Collectives&)> body;
    std::shared_ptr<Work> work;
  };

  std::shared_ptr<Work> submit(CallSignature call, bool async, std::function<void(Collectives&)> body);
  // Runs `collective` (a blocking call on host tensors) for GPU tensors through pinned staging:
  // `in` is copied to host slot 0, `out` (may be `in`) comes back from slot 1 (or 0 when the same).
  std::shared_ptr<Work> staged(const CallSignature& call, const Tensor& in, const Tensor& out,
                               const std::function<void(const Tensor&, const Tensor&)>& collective);
  // onCaller: on the thread that issued it (a blocking call), which may be interrupted (Ctrl-C).
  void execute(Task& task, bool onCaller);
  // Marks the backend busy, runs the task with `lock` released, then wakes whoever waits.
  void runLocked(std::unique_lock<std::mutex>& lock, Task& task, bool onCaller);
  void workerLoop();
  std::vector<tcp::Pair*> allLinks();  // every collective link (some may be unused: closed)
  void closeLinks();
  static void requireCpu(const Tensor& t, const char* what);
  // The signature of a collective on the whole of `data`, naming the shared buffer it is, if any
  // (CallSignature::buffer: then the shared-memory algorithms read it where it lies).
  CallSignature onBuffer(Collective c, const Tensor& data, ReduceOp op = ReduceOp::Sum) const;
  std::shared_ptr<Work> pointToPoint(Collective kind, const Tensor& data, int peer, int64_t tag);
  // A host tensor and a peer that is another rank of this world (or -1: any, where allowed).
  void checkPeer(const char* what, const Tensor& data, int peer, bool anySource);
  [[noreturn]] void failRendezvous(std::exception_ptr error);

  std::unique_ptr<tcp::StoreServer> server_;  // rank 0 only
  std::unique_ptr<tcp::TcpStore> store_;
  std::unique_ptr<tcp::Monitor> monitor_;
  tcp::Pair left_, right_;
  std::vector<tcp::Pair> partners_;  // recursive-doubling links (power-of-two worlds of 4+)
  std::unique_ptr<shm::Group> shm_;    // this host's ranks: collectives through shared memory
  // Several hosts (shm_ holds this host's ranks): the ring of this rank's counterparts on the
  // other hosts, and this rank's host on it.
  tcp::Pair hostLeft_, hostRight_;
  std::vector<tcp::Pair> hostPartners_;  // its recursive-doubling links there (4, 8, ... hosts)
  int host_ = 0, hosts_ = 1;
  bool shmRing_ = false;  // CYXWIZ_SHM_ALGORITHM=ring
  std::unique_ptr<tcp::PointToPoint> p2p_;  // send/recv; absent in a world of one
  std::atomic<uint64_t> p2pSequence_{0};
  std::vector<uint8_t> scratch_;  // receive and gather space, kept between calls
  PinnedStaging staging_;
  std::chrono::microseconds spin_;  // for blocking calls on the caller's thread

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  bool busy_ = false;      // a task is running (on either thread)
  int waiters_ = 0;        // blocking callers waiting for the backend to be free
  bool stopping_ = false;
  bool closed_ = false;
  std::atomic<bool> finalizing_{false};  // finalize() shut the links down under a call on another thread
  uint64_t sequence_ = 0;
  std::exception_ptr broken_;
  std::thread worker_;
};

}  // namespace cyxwiz::comm::cpu
