// Fields of the fixed-size records that cross a socket or shared memory (tcp/wire.h, call_header.h),
// copied at byte offsets: no alignment needed, and no padding sent. Every supported host is
// little-endian, which the records are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cyxwiz::comm::record {

template <typename T>
void put(uint8_t* out, size_t at, T v) {
  std::memcpy(out + at, &v, sizeof v);
}

template <typename T>
T get(const uint8_t* in, size_t at) {
  T v;
  std::memcpy(&v, in + at, sizeof v);
  return v;
}

}  // namespace cyxwiz::comm::record
