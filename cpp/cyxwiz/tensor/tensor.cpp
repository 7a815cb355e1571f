#include "cyxwiz/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/stream_release.h"
#include "cyxwiz/tensor/half.h"
#include "cyxwiz/tensor/host_cache.h"

namespace cyxwiz {

std::string shapeString(const Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += std::to_string(shape[i]);
    if (i + 1 < shape.size() || shape.size() == 1) out += ",";
    if (i + 1 < shape.size()) out += " ";
  }
  return out + ")";
}

int64_t shapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void throwDTypeMismatch(DType wanted, DType actual) {
  throw TypeMismatch(makeString("tensor holds ", dtypeName(actual), ", but ", dtypeName(wanted), " was required"));
}

void throwNotOnHost(const Device& device) {
  throw Error(makeString("a CPU operation received a tensor on ", device.str(),
                         "; move the model and its inputs to one device (model.to(\"", device.str(), "\"))"));
}

namespace {

std::shared_ptr<Storage> cudaStorage(size_t nbytes, const Device& device) {
  auto storage = std::make_shared<Storage>();
  storage->nbytes = nbytes;
  storage->device = device;
  if (nbytes) {
    device::drainStreamReleases();  // imported memory whose readers finished goes back to its owner
    cuda::Api& api = device::cudaApi();
    void* data = nullptr;
    device::check(api.malloc(device.index, nbytes, &data));
    const int dev = device.index;
    storage->data = data;
    storage->owner = std::shared_ptr<void>(data, [&api, dev](void* p) { api.free(dev, p); });
  }
  return storage;
}

cuda::CopyKind copyKind(const Device& dst, const Device& src) {
  if (src.type == DeviceType::CPU) return cuda::CopyKind::HostToDevice;
  if (dst.type == DeviceType::CPU) return cuda::CopyKind::DeviceToHost;
  return cuda::CopyKind::DeviceToDevice;
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) CYX_CHECK(d >= 0, "negative dimension in shape ", shapeString(shape));
  if (device.type == DeviceType::CUDA) {
    Tensor t;
    t.storage_ = cudaStorage(static_cast<size_t>(shapeNumel(shape)) * itemSize(dtype), device);
    t.shape_ = shape;
    t.dtype_ = dtype;
    return t;
  }
  // 64-byte alignment: whole cache lines and aligned AVX-512 loads in the kernels.
  size_t nbytes = static_cast<size_t>(shapeNumel(shape)) * itemSize(dtype);
  size_t padded = (nbytes + 63) / 64 * 64;
  void* data = padded ? host_cache::allocate(padded) : nullptr;
  if (padded && !data) throw std::bad_alloc();
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->nbytes = nbytes;
  storage->owner = std::shared_ptr<void>(data, [padded](void* p) { host_cache::release(p, padded); });
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (!t.nbytes()) return t;
  if (t.isCuda()) {
    CYX_CUDA(memsetZero(device.index, t.rawData(), t.nbytes()));
  } else {
    std::memset(t.rawData(), 0, t.nbytes());
  }
  return t;
}

Tensor Tensor::fromExternal(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner, Device device) {
  auto storage = std::make_shared<Storage>();
  storage->device = device;
  storage->data = data;
  storage->nbytes = static_cast<size_t>(shapeNumel(shape)) * itemSize(dtype);
  storage->owner = std::move(owner);
  storage->borrowed = true;
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::size(int64_t axis) const {
  int64_t n = dim();
  if (axis < 0) axis += n;
  CYX_CHECK(axis >= 0 && axis < n, "axis ", axis, " out of range for a tensor of shape ", shapeString(shape_));
  return shape_[static_cast<size_t>(axis)];
}

void* Tensor::rawData() const {
  if (!storage_ || !storage_->data) return nullptr;
  return static_cast<char*>(storage_->data) + offset_;
}

Tensor Tensor::view(int64_t elementOffset, const Shape& shape) const {
  CYX_CHECK(storage_, "view of an undefined tensor");
  size_t begin = offset_ + static_cast<size_t>(elementOffset) * itemSize(dtype_);
  size_t bytes = static_cast<size_t>(shapeNumel(shape)) * itemSize(dtype_);
  CYX_CHECK(elementOffset >= 0 && begin + bytes <= storage_->nbytes, "view of ", shapeString(shape), " at element ",
            elementOffset, " runs past the end of its storage (", storage_->nbytes, " bytes)");
  Tensor t;
  t.storage_ = storage_;
  t.offset_ = begin;
  t.shape_ = shape;
  t.dtype_ = dtype_;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copyFrom(*this);
  return t;
}

Tensor Tensor::to(const Device& target) const {
  if (!defined() || device() == target) return *this;
  Tensor t = empty(shape_, dtype_, target);
  t.copyFrom(*this);
  return t;
}

void Tensor::copyFrom(const Tensor& src) {
  CYX_CHECK(src.dtype_ == dtype_ && src.numel() == numel(), "cannot copy a ", dtypeName(src.dtype_), " tensor of shape ",
            shapeString(src.shape_), " into a ", dtypeName(dtype_), " tensor of shape ", shapeString(shape_));
  if (!nbytes() || rawData() == src.rawData()) return;
  if (!isCuda() && !src.isCuda()) {
    std::memmove(rawData(), src.rawData(), nbytes());
    return;
  }
  // The copy runs on the GPU side's compute stream, ordered after the kernels that produced src.
  const int dev = isCuda() ? device().index : src.device().index;
  CYX_CUDA(copy(dev, rawData(), src.rawData(), nbytes(), copyKind(device(), src.device())));
}

void Tensor::fill(double value) {
  int64_t n = numel();
  if (isCuda()) {
    if (dtype_ == DType::Float32) {
      CYX_CUDA(fill(device().index, deviceData<float>(), n, static_cast<float>(value)));
    } else {
      Tensor host = empty(shape_, dtype_);
      host.fill(value);
      copyFrom(host);
    }
    return;
  }
  if (n == 0) return;
  if (value == 0.0 && !std::signbit(value)) {  // zero bits in every dtype; libc's memset is the widest loop
    std::memset(rawData(), 0, static_cast<size_t>(n) * itemSize(dtype_));
    return;
  }
  switch (dtype_) {
    case DType::Float32: { float* p = data<float>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value); break; }
    case DType::Float64: { double* p = data<double>(); for (int64_t i = 0; i < n; ++i) p[i] = value; break; }
    case DType::Int32: { int32_t* p = data<int32_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value); break; }
    case DType::Int64: { int64_t* p = data<int64_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value); break; }
    case DType::Float16: std::fill_n(data<Half>(), n, Half{floatToHalf(static_cast<float>(value))}); break;
    case DType::BFloat16: std::fill_n(data<BFloat16>(), n, BFloat16{floatToBFloat16(static_cast<float>(value))}); break;
    case DType::Int8: std::fill_n(data<int8_t>(), n, static_cast<int8_t>(value)); break;
    case DType::UInt8: std::fill_n(data<uint8_t>(), n, static_cast<uint8_t>(value)); break;
    case DType::Int16: std::fill_n(data<int16_t>(), n, static_cast<int16_t>(value)); break;
    case DType::Bool: std::fill_n(data<bool>(), n, value != 0.0); break;
  }
}

}  // namespace cyxwiz
