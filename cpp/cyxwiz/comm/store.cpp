#include "cyxwiz/comm/store.h"

#include "cyxwiz/comm/backend.h"

#include <algorithm>
#include <thread>

namespace cyxwiz::comm {

std::vector<std::string> Store::waitAll(const std::vector<std::string>& keys, Deadline deadline) {
  std::vector<std::string> missing = keys;
  Clock::duration pause = std::chrono::microseconds(200);
  for (;;) {
    std::vector<std::string> still;
    for (const auto& k : missing) {
      // Each check answers at once; its own deadline lets the last one run after the wait's ends.
      if (!check(k, Clock::now() + std::chrono::seconds(10))) still.push_back(k);
    }
    missing.swap(still);
    if (missing.empty() || Clock::now() >= deadline) return missing;
    throwIfInterrupted("init");
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min<Clock::duration>(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace cyxwiz::comm
