// Point-to-point messages between any two ranks (send/recv), beside the ring.
//
// Each direction of a pair has a connection of its own, dialed by the sender to the receiver's ring
// port (kept open after init for this) the first time it sends there: no rank waits for another to
// connect, and two ranks that start sending to each other at once cannot race. One thread runs every
// connection under one poll(): it admits callers through the HelloGate (strangers included), writes
// queued messages in order, and reads arriving ones straight into the buffer of a matching recv
// (same source, same tag, first posted first), or into a buffer of its own until a recv asks for it.
// So a send completes once its bytes are in the kernel, whatever the receiver is doing, and two ranks
// that both send before they receive do not deadlock (Gloo's and MPI's eager protocol).
//
// Every operation is bounded by the timeout: a send whose bytes stop moving, a recv that no message
// matches. A connection that fails ends the operations waiting on it with an error naming the peer.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cyxwiz/comm/config.h"
#include "cyxwiz/comm/tcp/hello_gate.h"
#include "cyxwiz/comm/work.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::comm::tcp {

// The tag of a collective's messages: negative, and it says which collective and which call, so that
// ranks that disagree get a mismatch error rather than each other's bytes.
int64_t collectiveTag(const CallSignature& call);

class PointToPoint {
 public:
  // `gate`: this rank's ring port; `addresses`: every rank's, by rank (rendezvous.h).
  PointToPoint(const DistributedConfig& config, std::unique_ptr<HelloGate> gate, std::vector<std::string> addresses);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // `data` is held (and must stay untouched) until the work is done. `call` names the work in
  // messages: a send or recv of the user's, or the collective it is part of. Tags >= 0 are the
  // user's; a collective's messages carry collectiveTag(call).
  std::shared_ptr<Work> send(const Tensor& data, int dst, int64_t tag, const CallSignature& call);
  // src -1: the first matching message from any rank; Work::sourceRank() says whose it was.
  std::shared_ptr<Work> recv(const Tensor& data, int src, int64_t tag, const CallSignature& call);
  // Queued sends get until `flushBy` to leave; then every pending operation fails and links close.
  // Idempotent.
  void shutdown(Deadline flushBy);

 private:
  struct Op;
  struct Message;
  struct Inbound;
  struct Outbound;
  using Finished = std::pair<std::shared_ptr<Op>, std::exception_ptr>;

  std::shared_ptr<Op> makeOp(const CallSignature& call, const Tensor& data, int peer, int64_t tag);
  // A collective's recv and a message of another collective at the same position: a mismatch.
  void mismatch(const std::shared_ptr<Op>& op, int src, int64_t tag);
  void loop();
  // Each returns with the operations it ended in finished_; none of them waits.
  void admit(HelloGate::Arrival arrival);
  void dial(int dst);
  void advanceDial(int dst);
  void writeTo(int dst);
  void readFrom(Inbound& in);
  void onHeader(Inbound& in);
  void deliver(Message& m);
  void closeInbound(Inbound& in, const std::string& why);
  void failOutbound(int dst, std::exception_ptr error);
  void expire();
  int pollTimeoutMs();
  void finishAll(std::vector<Finished>& done);
  void wake();
  std::string peerName(int rank) const;

  DistributedConfig config_;
  std::unique_ptr<HelloGate> gate_;
  std::vector<std::string> addresses_;

  std::mutex mutex_;
  std::vector<std::unique_ptr<Outbound>> out_;     // by destination rank
  std::vector<std::unique_ptr<Inbound>> in_;       // links other ranks dialed to send here
  std::deque<std::shared_ptr<Op>> posted_;         // recvs no message has matched yet
  std::deque<std::shared_ptr<Message>> unexpected_;  // arrived (or arriving) before any recv matched
  std::vector<std::string> closedFrom_;            // why rank r's link to here closed ("" while open)
  std::vector<Finished> finished_;                 // to finish once the lock is released
  bool stopping_ = false, stopped_ = false;
  Deadline flushBy_{};
  platform::Wakeup wake_{rankPrefix() + "init: "};  // the loop polls it beside the sockets
  std::thread thread_;
};

}  // namespace cyxwiz::comm::tcp
