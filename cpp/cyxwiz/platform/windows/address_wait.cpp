#include "cyxwiz/platform/address_wait.h"

#include "cyxwiz/platform/sleep_wait.h"

namespace cyxwiz::platform {

// WaitOnAddress wakes threads of one process only: between ranks the word is watched with naps.
void waitOnAddress(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms) { sleepWhileEqual(word, expected, ms); }
void wakeAll(std::atomic<uint32_t>*) {}
bool addressWaitIsNative() { return false; }

}  // namespace cyxwiz::platform
