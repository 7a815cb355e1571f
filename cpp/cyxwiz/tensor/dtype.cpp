#include "cyxwiz/tensor/dtype.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz {

size_t itemSize(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::Int16: return 2;
    case DType::Bool: return 1;
  }
  throw InvalidArgument(makeString("unknown dtype code ", static_cast<int>(dtype)));
}

std::string dtypeName(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int16: return "int16";
    case DType::Bool: return "bool";
  }
  return makeString("dtype(", static_cast<int>(dtype), ")");
}

bool isFloating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Float16 || dtype == DType::BFloat16;
}

std::string Device::str() const {
  return type == DeviceType::CPU ? "cpu" : makeString("cuda:", index);
}

}  // namespace cyxwiz
