#include "cyxwiz/common/env.h"

#include <cctype>
#include <cstdlib>
#include <limits>

#include "cyxwiz/common/error.h"

namespace cyxwiz {

namespace {

// A sign and digits: what parseInteger refuses only when it overflows (then "out of range").
bool allDigits(const std::string& text) {
  const size_t first = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  return first < text.size() && text.find_first_not_of("0123456789", first) == std::string::npos;
}

}  // namespace

std::optional<std::string> envString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::optional<int64_t> parseInteger(const std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const size_t first = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (first >= text.size()) return std::nullopt;
  uint64_t value = 0;
  const uint64_t limit = negative ? uint64_t{1} << 63 : static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (size_t i = first; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (limit - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

int64_t checkedInteger(const char* name, const std::string& value, int64_t lo, int64_t hi, const std::string& expected) {
  const std::string what = expected.empty() ? makeString("an integer in ", lo, "..", hi) : expected;
  std::optional<int64_t> n = parseInteger(value);
  if (!n && !allDigits(value)) throw InvalidArgument(makeString(name, "='", value, "' is not an integer: expected ", what));
  if (!n || *n < lo || *n > hi) throw InvalidArgument(makeString(name, "='", value, "' is out of range: expected ", what));
  return *n;
}

int64_t envInt(const char* name, int64_t fallback, int64_t lo, int64_t hi, const std::string& expected) {
  std::optional<std::string> v = envString(name);
  return v && !v->empty() ? checkedInteger(name, *v, lo, hi, expected) : fallback;
}

bool envFlag(const char* name, bool fallback) {
  std::optional<std::string> v = envString(name);
  if (!v || v->empty()) return fallback;
  std::string s;
  for (char c : *v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw InvalidArgument(makeString(name, "='", *v, "' is not a flag: expected 1 or 0 (also true/false, yes/no, on/off)"));
}

}  // namespace cyxwiz
