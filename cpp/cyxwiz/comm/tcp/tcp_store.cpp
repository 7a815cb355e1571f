#include "cyxwiz/comm/tcp/tcp_store.h"

#include "cyxwiz/comm/backend.h"

#include <cerrno>
#include <charconv>
#include <thread>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::comm::tcp {

JobIdentity jobIdentityOf(const DistributedConfig& config) {
  return {wire::hashJobId(config.jobId), config.worldSize, config.rank, config.secret, config.generation};
}

Socket dialRendezvous(const DistributedConfig& config, wire::Channel channel, Deadline deadline) {
  wire::Hello hello;
  hello.channel = channel;
  hello.jobHash = wire::hashJobId(config.jobId);
  hello.worldSize = static_cast<uint32_t>(config.worldSize);
  hello.rank = static_cast<uint32_t>(config.rank);
  hello.generation = config.generation;
  std::string master = makeString(config.masterAddr, ":", config.masterPort);
  std::string lastError = "no attempt finished";
  auto pause = std::chrono::milliseconds(10);
  for (int attemptNo = 0;; ++attemptNo) {
    int err = 0;
    // With a span of candidate ports, try them in turn: rank 0 serves on the first free one.
    int port = config.masterPort + attemptNo % std::max(1, config.portSpan);
    master = makeString(config.masterAddr, ":", port);
    Deadline attempt = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    Socket s = Socket::connectTo(config.masterAddr, port, attempt, &err);
    if (s.valid()) {
      HelloAnswer answer = sayHello(s, hello, config.secret, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
      if (answer.kind == HelloAnswer::Welcome) {
        s.setLiveness(config.timeoutMs);  // an idle monitor still notices a cut cable to rank 0
        return s;
      }
      if (answer.kind == HelloAnswer::Refused && config.portSpan == 1) {
        throw StoreError(makeString(rankPrefix(), "init: rank 0's rendezvous at ", master, " refused this rank: ", answer.reason));
      }
      lastError = makeString(answer.reason, " from ", master);
    } else if (err == ECONNREFUSED) {
      lastError = "Connection refused to " + master;
    } else if (err == ENOENT) {
      lastError = makeString("cannot resolve MASTER_ADDR '", config.masterAddr, "'");
    } else {
      lastError = makeString(errnoString(err), " connecting to ", master);
    }
    if (Clock::now() >= deadline) break;
    throwIfInterrupted("init");
    if ((attemptNo + 1) % std::max(1, config.portSpan) != 0) continue;  // next candidate port at once
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  throw TimeoutError(makeString(
      rankPrefix(), "init: Timeout waiting for peers: could not reach rank 0's rendezvous at ", master, " within ",
      config.timeoutMs, " ms (last error: ", lastError, "). Start rank 0, check that MASTER_ADDR/MASTER_PORT are the "
      "same on every rank and reachable from here (firewall), or raise DISTRIBUTED_TIMEOUT_MS"));
}

TcpStore::TcpStore(const DistributedConfig& config, Deadline deadline)
    : socket_(dialRendezvous(config, wire::Channel::Store, deadline)),
      master_(makeString(config.masterAddr, ":", config.masterPort)) {}

std::string TcpStore::request(wire::StoreOp op, const std::string& key, const std::string& value, Deadline deadline) {
  std::vector<uint8_t> out(wire::kFrameBytes + key.size() + value.size());
  wire::encodeFrame({static_cast<uint8_t>(op), 0, static_cast<uint32_t>(key.size()), value.size()}, out.data());
  std::memcpy(out.data() + wire::kFrameBytes, key.data(), key.size());
  std::memcpy(out.data() + wire::kFrameBytes + key.size(), value.data(), value.size());
  IoStatus st = socket_.sendAll(out.data(), out.size(), deadline);
  uint8_t head[wire::kFrameBytes];
  if (st.ok()) st = socket_.recvAll(head, sizeof head, deadline);
  std::string reply;
  if (st.ok()) {
    wire::Frame f = wire::decodeFrame(head);
    // Checked before allocating: the length is the peer's word, and the peer may not be rank 0.
    // Type 0 answers, type 1 is the store's refusal with its reason.
    const uint64_t cap = f.type == 0 ? wire::kMaxStoreValueBytes : wire::kMaxReasonBytes;
    if (f.type > 1 || f.length > cap) {
      notMaster(f.type > 1 ? makeString("a reply of unknown type ", static_cast<int>(f.type))
                           : makeString("a reply of ", f.length, " bytes (", f.type == 0 ? "a store value" : "a refusal",
                                        " holds at most ", cap, ")"));
    }
    reply.resize(f.length);
    st = socket_.recvAll(reply.data(), reply.size(), deadline);
  }
  if (st.kind == IoStatus::TimedOut) {
    socket_.close();  // a late answer would be read as the next one's
    throw TimeoutError(makeString(rankPrefix(), "store: Timeout waiting for peers: key '", key, "' on rank 0's store (",
                                  master_, ") did not appear in time"));
  }
  if (!st.ok()) {
    socket_.close();
    throw NetworkError(makeString(rankPrefix(), "store: lost the connection to rank 0 (", master_, "): ", st.describe(),
                                  "; rank 0 died or finalized"));
  }
  if (head[0] != 0) throw StoreError(makeString(rankPrefix(), "store: rank 0's store (", master_, ") refused key '", key, "': ", reply));
  return reply;
}

void TcpStore::notMaster(const std::string& what) {
  std::string peer = socket_.peerAddress();
  socket_.close();  // the rest of its stream means nothing
  throw StoreError(makeString(rankPrefix(), "store: the peer at ", peer == "?" ? master_ : peer,
                              ", where rank 0's store should be, sent ", what, ": it is not a pycyxwiz master of this "
                              "job (another program on that port?); check MASTER_ADDR and MASTER_PORT"));
}

void TcpStore::set(const std::string& key, const std::string& value, Deadline deadline) {
  request(wire::StoreOp::Set, key, value, deadline);
}

std::string TcpStore::get(const std::string& key, Deadline deadline) { return request(wire::StoreOp::Get, key, "", deadline); }

bool TcpStore::check(const std::string& key, Deadline deadline) {
  return request(wire::StoreOp::Check, key, "", deadline) == "1";
}

int64_t TcpStore::add(const std::string& key, int64_t delta, Deadline deadline) {
  std::string reply = request(wire::StoreOp::Add, key, std::to_string(delta), deadline);
  int64_t value = 0;
  auto [end, err] = std::from_chars(reply.data(), reply.data() + reply.size(), value);
  if (err != std::errc() || end != reply.data() + reply.size() || reply.empty()) {
    notMaster(makeString("'", reply.substr(0, 32), "' as the value of counter '", key, "'"));
  }
  return value;
}

}  // namespace cyxwiz::comm::tcp
