// Tensor: a shape, a dtype, a device and a view (byte offset) into shared contiguous storage.
//
// Storage is reference counted and may belong to someone else (a numpy array, a DDP gradient
// bucket): the owner handle keeps it alive, so wrapping an external buffer costs no copy.
// Tensors are always contiguous (row-major); a view is a contiguous slice of its storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cyxwiz/tensor/dtype.h"

namespace cyxwiz {

using Shape = std::vector<int64_t>;

std::string shapeString(const Shape& shape);  // "(64, 784)"
int64_t shapeNumel(const Shape& shape);

struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::shared_ptr<void> owner;  // frees or releases the memory when the last Tensor goes
  bool borrowed = false;        // memory someone outside the engine may write to (a numpy array)
};

class Tensor {
 public:
  Tensor() = default;

  // On a CUDA device the memory comes from libcyxwiz_cuda.so (cyxwiz/device/cuda.h).
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32, Device device = Device{});
  static Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = Device{});
  // Wraps memory owned elsewhere; `owner` keeps it alive for as long as any view exists.
  static Tensor fromExternal(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                             Device device = Device{});

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;
  int64_t numel() const { return shapeNumel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device{}; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  bool isCuda() const { return device().type == DeviceType::CUDA; }

  void* rawData() const;
  // Host pointer: throws when the tensor lives on a GPU (a CPU kernel must never see device memory).
  template <typename T> T* data() const;
  // Pointer on the tensor's own device, for GPU kernels.
  template <typename T> T* deviceData() const;

  // A tensor of `shape` over this one's storage starting `elementOffset` elements in.
  Tensor view(int64_t elementOffset, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const { return view(0, shape); }
  Tensor clone() const;                // same device
  Tensor to(const Device& device) const;  // *this when already there, else a copy
  void copyFrom(const Tensor& src);  // same numel and dtype; shapes and devices may differ
  void fill(double value);
  bool sharesStorageWith(const Tensor& other) const { return storage_ && storage_ == other.storage_; }
  bool borrowed() const { return storage_ && storage_->borrowed; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::Float32;
};

[[noreturn]] void throwDTypeMismatch(DType wanted, DType actual);
[[noreturn]] void throwNotOnHost(const Device& device);

template <typename T>
T* Tensor::deviceData() const {
  if (DTypeOf<T>::value != dtype_) throwDTypeMismatch(DTypeOf<T>::value, dtype_);
  return static_cast<T*>(rawData());
}

template <typename T>
T* Tensor::data() const {
  if (storage_ && storage_->device.type != DeviceType::CPU) throwNotOnHost(storage_->device);
  return deviceData<T>();
}

}  // namespace cyxwiz
