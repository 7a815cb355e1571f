#include "cyxwiz/platform/random.h"

namespace cyxwiz::platform {

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  randomBytes(raw.data(), bytes);
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(digits[c >> 4]);
    hex.push_back(digits[c & 15]);
  }
  return hex;
}

}  // namespace cyxwiz::platform
