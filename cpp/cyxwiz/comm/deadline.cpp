#include "cyxwiz/comm/deadline.h"

#include <climits>

namespace cyxwiz::comm {

Deadline deadlineAfterMs(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }

int msUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

}  // namespace cyxwiz::comm
