// Store: the key-value rendezvous every rank can reach. Four verbs, every one bounded by a deadline.
#pragma once

#include <string>
#include <vector>

#include "cyxwiz/comm/deadline.h"

namespace cyxwiz::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value, Deadline deadline) = 0;
  // Waits until some rank has set `key`; TimeoutError naming the key when the deadline passes.
  virtual std::string get(const std::string& key, Deadline deadline) = 0;
  virtual bool check(const std::string& key, Deadline deadline) = 0;
  virtual int64_t add(const std::string& key, int64_t delta, Deadline deadline) = 0;

  // Waits until every key exists. Returns the keys still missing at the deadline (empty: all there).
  std::vector<std::string> waitAll(const std::vector<std::string>& keys, Deadline deadline);
};

}  // namespace cyxwiz::comm
