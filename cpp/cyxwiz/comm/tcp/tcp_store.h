// TcpStore: this rank's client of the store that rank 0 serves (store_server.h).
#pragma once

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/deadline.h"
#include "cyxwiz/comm/store.h"
#include "cyxwiz/comm/tcp/handshake.h"
#include "cyxwiz/comm/tcp/wire.h"

namespace cyxwiz::comm::tcp {

JobIdentity jobIdentityOf(const DistributedConfig& config);

// Connects to rank 0's rendezvous, retrying until the deadline so that start order does not matter,
// and introduces this rank on `channel`. TimeoutError ("Timeout waiting for peers ...") when rank 0
// never answers; StoreError when it answers but refuses this rank (another job, wrong world size).
Socket dialRendezvous(const DistributedConfig& config, wire::Channel channel, Deadline deadline);

class TcpStore : public Store {
 public:
  TcpStore(const DistributedConfig& config, Deadline deadline);

  void set(const std::string& key, const std::string& value, Deadline deadline) override;
  std::string get(const std::string& key, Deadline deadline) override;
  bool check(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta, Deadline deadline) override;

  // The address of the interface that reaches rank 0: the one other ranks can reach us on.
  std::string localIp() const { return socket_.localIp(); }

 private:
  std::string request(wire::StoreOp op, const std::string& key, const std::string& value, Deadline deadline);
  // The answer cannot come from rank 0's store (a length no store value has, a malformed reply).
  [[noreturn]] void notMaster(const std::string& what);

  Socket socket_;
  std::string master_;  // "host:port", for messages
};

}  // namespace cyxwiz::comm::tcp
