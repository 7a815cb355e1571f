// Environment variables, read strictly: a value that is not what the variable takes is an
// InvalidArgument (Python: ValueError) naming the variable, the value and what it accepts, never a
// silent 0 or a number cut short ("1MB" is not 1 byte).
//
// The config variables of a job (RANK, MASTER_PORT, ...) are read once, by DistributedConfig; the
// engine's tuning variables travel in it too, so no algorithm reads the environment itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cyxwiz {

// The value of `name`; nullopt when it is not set (an empty value is a value).
std::optional<std::string> envString(const char* name);

// Strict base-10: "4", "-4" yes; "", " 4", "4x", "1e3", "0x10", "1MB" and overflows no.
std::optional<int64_t> parseInteger(const std::string& text);

// `value` of variable `name` as an integer in lo..hi, else InvalidArgument:
//   NAME='1MB' is not an integer: expected <expected>
//   NAME='0' is out of range: expected <expected>
// `expected` defaults to "an integer in lo..hi".
int64_t checkedInteger(const char* name, const std::string& value, int64_t lo, int64_t hi,
                       const std::string& expected = "");

// The integer value of `name` in lo..hi (checkedInteger); `fallback` when unset or empty.
int64_t envInt(const char* name, int64_t fallback, int64_t lo, int64_t hi, const std::string& expected = "");

// 1/0, true/false, yes/no, on/off (any case) of `name`; `fallback` when unset or empty.
bool envFlag(const char* name, bool fallback);

}  // namespace cyxwiz
