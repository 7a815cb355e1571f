// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104): ranks prove they hold the job's shared secret
// without sending it. Checked against Python's hashlib/hmac in tests/distributed/test_secret.py.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cyxwiz {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t n);
Digest hmacSha256(const std::string& key, const void* data, size_t n);
// Compares in time independent of where the first difference is.
bool digestsEqual(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace cyxwiz
