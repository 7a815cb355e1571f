#include "cyxwiz/tensor/dtype.h"

#include "cyxwiz/common/error.h"

namespace cyxwiz {

size_t itemSize(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
  }
  throw InvalidArgument(makeString("unknown dtype code ", static_cast<int>(dtype)));
}

std::string dtypeName(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
  }
  return makeString("dtype(", static_cast<int>(dtype), ")");
}

std::string Device::str() const {
  return type == DeviceType::CPU ? "cpu" : makeString("cuda:", index);
}

}  // namespace cyxwiz
