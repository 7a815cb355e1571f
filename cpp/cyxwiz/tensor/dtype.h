// Element types and devices a Tensor can hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cyxwiz {

enum class DType : uint8_t { Float32 = 0, Float64 = 1, Int32 = 2, Int64 = 3 };

size_t itemSize(DType dtype);
std::string dtypeName(DType dtype);  // numpy spelling: "float32", ...

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };

// CPU only for now; the field exists so that CUDA storage slots in without changing signatures.
enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  std::string str() const;
  bool operator==(const Device& other) const { return type == other.type && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

}  // namespace cyxwiz
