// Sleeping on a 32-bit word in shared memory until another process changes it.
// Linux: a futex (shared, not FUTEX_PRIVATE). Elsewhere (macOS, the portable POSIX build, Windows,
// whose WaitOnAddress does not cross processes): short sleeps that look at the word, growing from
// tens of microseconds to a millisecond: the same deadlines, a little more latency for a sleeper.
#pragma once

#include <atomic>
#include <cstdint>

namespace cyxwiz::platform {

// Returns when *word != expected, on wakeAll(word), after about ms milliseconds, or spuriously.
void waitOnAddress(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms);
void wakeAll(std::atomic<uint32_t>* word);
// Whether waitOnAddress really sleeps in the kernel (false: it polls the word).
bool addressWaitIsNative();

}  // namespace cyxwiz::platform
