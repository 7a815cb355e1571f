// The rendezvous served by rank 0 on MASTER_ADDR:MASTER_PORT: a small key-value store (set, get
// that waits for the key, check, add) and the job's monitor.
//
// Every rank keeps two connections here: a store connection for rendezvous requests and a monitor
// connection on which it reports its own failure. The server tells every other rank when one rank
// reports a failure or disappears without saying goodbye, so a failure anywhere stops every rank
// within moments instead of leaving them blocked until their timeout.
//
// One thread, one poll loop, a small state machine per connection; a silent or garbled connection
// costs nothing but a log line (the HelloGate sees to it). The store holds what the rendezvous
// needs (the ranks' addresses) and refuses more than a quota: 16 MiB per value, 64 MiB and 65536
// keys in all.
#pragma once

#include <atomic>
#include <thread>

#include <memory>

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/tcp/hello_gate.h"

namespace cyxwiz::comm::tcp {

class StoreServer {
 public:
  // Binds the first free port of masterPort .. masterPort + portSpan - 1 on the interface that
  // MASTER_ADDR names (loopback for a loopback job; NetworkError naming the port when all are busy)
  // and starts serving.
  explicit StoreServer(const DistributedConfig& config);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Tells every monitor the job ends on purpose, then closes everything.
  void stop();
  int port() const { return port_; }

 private:
  void run();

  std::unique_ptr<HelloGate> gate_;
  int port_;
  JobIdentity job_;
  std::unique_ptr<platform::Wakeup> wake_;  // stop() wakes the loop with it
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace cyxwiz::comm::tcp
