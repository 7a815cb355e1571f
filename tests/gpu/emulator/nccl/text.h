// TEST DOUBLE, NOT GPU SUPPORT. How the emulated NCCL builds its messages: cat("cuda:", dev, " failed")
// (copied from the old emulator's emulated_text.h).
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

namespace cxemu::nccl {

inline void put(std::string& s, const char* p) { s.append(p); }
inline void put(std::string& s, const std::string& p) { s.append(p); }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void put(std::string& s, T v) {
  char b[32];
  if constexpr (std::is_signed_v<T>) {
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(b, sizeof b, "%llu", static_cast<unsigned long long>(v));
  }
  s.append(b);
}
inline void put(std::string& s, float v) {  // as std::to_string(float) in the real messages
  char b[64];
  std::snprintf(b, sizeof b, "%f", static_cast<double>(v));
  s.append(b);
}

template <class... T>
std::string cat(const T&... parts) {
  std::string s;
  (put(s, parts), ...);
  return s;
}

}  // namespace cxemu::nccl
