// Deadlines: every blocking wait in comm (sockets, the store, the monitor, shared memory) is bounded
// by a point on the steady clock, not a duration, so the steps of one wait share one bound.
#pragma once

#include <chrono>
#include <cstdint>

namespace cyxwiz::comm {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

Deadline deadlineAfterMs(int64_t ms);
// Milliseconds left, clamped to [0, INT_MAX] for poll().
int msUntil(Deadline deadline);

}  // namespace cyxwiz::comm
