// Cryptographic random bytes from the operating system, without opening a descriptor (so it works
// while a connection flood holds them all): getrandom, getentropy or BCryptGenRandom.
#pragma once

#include <cstddef>
#include <string>

namespace cyxwiz::platform {

void randomBytes(void* out, size_t n);  // throws cyxwiz::Error when the system refuses
std::string randomHex(size_t bytes);     // `bytes` random bytes as 2*bytes hex digits

}  // namespace cyxwiz::platform
