// CRC-32 (IEEE 802.3, as zlib's crc32) for file checksums.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cyxwiz {

uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace cyxwiz
