// Element types and devices a Tensor can hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cyxwiz {

// The codes travel in collective headers (comm/call_header.cpp) and the first four are cast to the CUDA
// ABI's ElemType (comm/nccl): append new types, never renumber.
enum class DType : uint8_t {
  Float32 = 0, Float64 = 1, Int32 = 2, Int64 = 3,
  // The communication types: collectives carry and reduce them; the nn engine computes in float32
  // and refuses them (cyxwiz/tensor/half.h converts the 16-bit floats).
  Float16 = 4, BFloat16 = 5, Int8 = 6, UInt8 = 7, Int16 = 8, Bool = 9,
};

size_t itemSize(DType dtype);
std::string dtypeName(DType dtype);  // numpy spelling: "float32", ...; "bfloat16" (as torch and ml_dtypes)
bool isFloating(DType dtype);        // float16, bfloat16, float32, float64

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::Int8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::Int16; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };
// Float16 and BFloat16 elements are read through cyxwiz::Half / cyxwiz::BFloat16 (half.h).

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
