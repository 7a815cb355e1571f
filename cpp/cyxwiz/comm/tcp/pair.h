// A link to one neighbour in the ring: the socket, and who is at the other end, for messages.
#pragma once

#include <string>

#include "cyxwiz/comm/tcp/socket.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::tcp {

struct Pair {
  Socket socket;
  int rank = -1;
  std::string address;  // "ip:port" of the peer's listener
  std::string name() const { return makeString("rank ", rank, " (", address, ")"); }
};

}  // namespace cyxwiz::comm::tcp
