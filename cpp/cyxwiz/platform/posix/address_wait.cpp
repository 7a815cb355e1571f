#include "cyxwiz/platform/address_wait.h"

#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#else
#include "cyxwiz/platform/sleep_wait.h"
#endif

namespace cyxwiz::platform {

#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)

// Shared between processes: no FUTEX_PRIVATE_FLAG.
void waitOnAddress(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms) {
  timespec t{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000L};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &t, nullptr, 0);
}

void wakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool addressWaitIsNative() { return true; }

#else

void waitOnAddress(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms) { sleepWhileEqual(word, expected, ms); }
void wakeAll(std::atomic<uint32_t>*) {}
bool addressWaitIsNative() { return false; }

#endif

}  // namespace cyxwiz::platform
