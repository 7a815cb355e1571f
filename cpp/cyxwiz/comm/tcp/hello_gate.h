// The door of a listening port (rank 0's rendezvous, every rank's ring port): it accepts every
// waiting connection under its owner's poll loop, runs each one's handshake (AcceptorHello) as its
// bytes arrive, and hands over those that prove they belong to the job.
//
// Strangers cost little and never block a rank: a connection has helloTimeoutMs to finish its
// hello; at most a few of them wait at once (overall and per address: the oldest is closed when
// more come); and when the process runs out of descriptors, the oldest waiting one is closed, or a
// spare descriptor accepts-and-closes the newcomer, so that the listener never stays readable with
// nothing done about it (which would spin the loop).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/comm/tcp/handshake.h"
#include "cyxwiz/platform/wakeup.h"

namespace cyxwiz::comm::tcp {

class HelloGate {
 public:
  struct Arrival {
    Socket socket;
    wire::Hello hello;
    std::string address;        // "ip:port" of the caller
    std::vector<uint8_t> rest;  // bytes it sent after the handshake (pipelined requests)
  };
  // Decides on a caller that passed the hello and proved the secret: "" welcomes it; a reason
  // refuses it; with *later set, asks it to try again (it reached this rank's previous init()).
  using Decide = std::function<std::string(const wire::Hello&, const std::string& address, bool* later)>;

  // `where`: the log's prefix ("rendezvous", "init: ring port").
  HelloGate(Socket listener, const JobIdentity& job, bool ringPort, int64_t helloTimeoutMs, std::string where);
  ~HelloGate();
  HelloGate(const HelloGate&) = delete;
  HelloGate& operator=(const HelloGate&) = delete;

  // Appends pollfds for the listener and the connections in their hello; handle() takes them back.
  void addPollFds(std::vector<platform::PollFd>& fds);
  // Handles the events of the fds added last (`fds` points at the first), accepts, and closes
  // hellos past their deadline; returns the connections admitted.
  std::vector<Arrival> handle(const platform::PollFd* fds, const Decide& decide);
  // Milliseconds until the oldest hello's deadline (for the poll timeout); -1 when none waits.
  int msUntilNextDeadline() const;
  int port() const { return listener_.localPort(); }
  void setWhere(std::string where) { where_ = std::move(where); }
  void close();

 private:
  struct Pending;
  void acceptAll(const Decide& decide, std::vector<Arrival>& admitted);
  void makeRoom(const std::string& ip);
  bool shedOne();
  // Reads what arrived and advances the handshake; false once the connection is finished with.
  bool advance(Pending& p, const Decide& decide, std::vector<Arrival>& admitted);
  void logEviction(const std::string& why);

  Socket listener_;
  JobIdentity job_;
  bool ringPort_;
  int64_t helloTimeoutMs_;
  std::string where_;
  size_t maxPending_, maxPerAddress_;
  platform::DescriptorReserve spare_;  // to accept-and-close with when no descriptor is left
  std::vector<std::unique_ptr<Pending>> pending_;
  bool listenerPolled_ = false;
  Deadline pausedUntil_{};  // the listener rests: nothing could be accepted
  size_t evicted_ = 0;
  Deadline nextEvictionLog_{};
};

}  // namespace cyxwiz::comm::tcp
