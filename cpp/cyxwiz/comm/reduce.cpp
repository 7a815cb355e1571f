#include "cyxwiz/comm/reduce.h"

#include <algorithm>
#include <cstdint>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

namespace {

template <typename T, typename F>
void apply(void* acc, const void* in, size_t n, F f) {
  T* __restrict a = static_cast<T*>(acc);
  const T* __restrict b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) a[i] = f(a[i], b[i]);
}

template <typename T>
void reduceTyped(void* acc, const void* in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: apply<T>(acc, in, n, [](T x, T y) { return x + y; }); return;
    case ReduceOp::Product: apply<T>(acc, in, n, [](T x, T y) { return x * y; }); return;
    // NaN wins, as in numpy.maximum/minimum and torch: a NaN gradient must not vanish in a MAX.
    case ReduceOp::Max: apply<T>(acc, in, n, [](T x, T y) { return (x != x || x > y) ? x : (y != y ? y : std::max(x, y)); }); return;
    case ReduceOp::Min: apply<T>(acc, in, n, [](T x, T y) { return (x != x || x < y) ? x : (y != y ? y : std::min(x, y)); }); return;
  }
}

}  // namespace

void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: reduceTyped<float>(acc, in, count, op); return;
    case DType::Float64: reduceTyped<double>(acc, in, count, op); return;
    case DType::Int32: reduceTyped<int32_t>(acc, in, count, op); return;
    case DType::Int64: reduceTyped<int64_t>(acc, in, count, op); return;
  }
}

void finishAverage(void* data, size_t count, DType dtype, int worldSize) {
  if (dtype == DType::Float32) {
    float* d = static_cast<float*>(data);
    const float n = static_cast<float>(worldSize);
    for (size_t i = 0; i < count; ++i) d[i] /= n;
  } else if (dtype == DType::Float64) {
    double* d = static_cast<double*>(data);
    const double n = static_cast<double>(worldSize);
    for (size_t i = 0; i < count; ++i) d[i] /= n;
  }
}

void checkReduceOp(ReduceOp op, DType dtype) {
  if (op == ReduceOp::Avg && dtype != DType::Float32 && dtype != DType::Float64) {
    throw InvalidArgument(makeString("ReduceOp.AVG needs a floating-point array, got ", dtypeName(dtype),
                                     "; use ReduceOp.SUM and divide by the world size yourself"));
  }
}

}  // namespace cyxwiz::comm
