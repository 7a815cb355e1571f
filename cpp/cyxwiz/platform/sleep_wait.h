// The portable sleep on a shared word (address_wait.h), for systems without a cross-process futex:
// look at the word, give the processor away (a yield: the peer that will change the word may be
// waiting for it, and a timed sleep costs a timer tick on Windows), and after 200 us of that sleep
// a little and look again, the sleeps growing from 50 us to 1 ms.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace cyxwiz::platform {

inline void sleepWhileEqual(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now(), until = start + std::chrono::milliseconds(ms);
  const auto yieldUntil = start + std::chrono::microseconds(200);
  std::chrono::microseconds nap{50};
  for (auto now = start; word->load(std::memory_order_acquire) == expected && now < until; now = Clock::now()) {
    if (now < yieldUntil) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
    }
  }
}

}  // namespace cyxwiz::platform
