// Argument checks of the ApiImpl methods of the sequence layers (ops_embedding.cpp, ops_layernorm.cpp,
// ops_attention.cpp): a Status naming the call, the device and what was wrong.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda {

inline Status invalidArgument(const char* who, int dev, const std::string& what) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": " + what;
}

// The first null among the named pointers, as an error; empty when none is.
inline Status nullArguments(const char* who, int dev, std::initializer_list<std::pair<const char*, const void*>> args) {
  for (const auto& [name, p] : args) {
    if (!p) return invalidArgument(who, dev, std::string(name) + " is null");
  }
  return {};
}

// Sizes that must be positive, named.
inline Status nonPositive(const char* who, int dev, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, v] : sizes) {
    if (v <= 0) return invalidArgument(who, dev, std::string(name) + "=" + std::to_string(v) + " must be positive");
  }
  return {};
}

}  // namespace cyxwiz::cuda
