#include "dlpack.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/stream_release.h"
#include "gil.h"

namespace cyxwiz::bindings {

namespace {

// The ABI of dlpack.h (v0.8 and 1.0, unversioned tensor), declared here rather than vendored: these
// few structs are the stable part of the standard.
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";
// __dlpack__'s stream for CUDA: the legacy default stream, which both sides can name.
constexpr int kLegacyDefaultStream = 1;

DLDataType dlType(DType dtype) {
  switch (dtype) {
    case DType::Float32: return {kDLFloat, 32, 1};
    case DType::Float64: return {kDLFloat, 64, 1};
    case DType::Int32: return {kDLInt, 32, 1};
    case DType::Int64: return {kDLInt, 64, 1};
    case DType::Float16: return {kDLFloat, 16, 1};
    case DType::BFloat16: return {kDLBfloat, 16, 1};
    case DType::Int8: return {kDLInt, 8, 1};
    case DType::UInt8: return {kDLUInt, 8, 1};
    case DType::Int16: return {kDLInt, 16, 1};
    case DType::Bool: return {kDLBool, 8, 1};
  }
  throw Error("DLPack: unknown dtype");
}

// What the exported DLManagedTensor points into, freed by the consumer through the deleter.
struct Export {
  Tensor tensor;
  uintptr_t consumerStream = 1;  // 0: the consumer asked for no synchronisation (stream=-1)
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

void deleteExport(DLManagedTensor* self) {
  // No GIL needed, whichever thread the consumer calls this from: a Python owner of the tensor's
  // storage releases itself through releaseWithGil (gil.h).
  auto* e = static_cast<Export*>(self->manager_ctx);
  if (e->tensor.isCuda() && e->consumerStream) {
    // Our free is stream-ordered on the compute stream; the consumer's kernels that read the memory
    // may still be queued on its stream, so the compute stream waits for them first. No runtime left
    // (exit): nothing can read it any more.
    if (cuda::Api* api = device::tryCudaApi()) api->computeWaitsForStream(e->tensor.device().index, e->consumerStream);
  }
  delete e;
}

// The producer's deleter releases Python objects: it runs with the GIL (gil.h).
void releaseManaged(void* p) {
  auto* m = static_cast<DLManagedTensor*>(p);
  if (m->deleter) m->deleter(m);
}

// A capsule nobody consumed still owns its tensor (the consumer renames a used one).
void destroyCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsule)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (managed && managed->deleter) managed->deleter(managed);
}

}  // namespace

py::tuple dlpackDevice(const Tensor& t) {
  return t.isCuda() ? py::make_tuple(static_cast<int>(kDLCUDA), t.device().index) : py::make_tuple(static_cast<int>(kDLCPU), 0);
}

py::capsule toDLPack(const Tensor& t, uintptr_t consumerStream) {
  CYX_CHECK(t.defined(), "__dlpack__: the tensor is empty (undefined)");
  if (t.isCuda()) {
    // The consumer reads on its own stream right away: the engine's queued kernels must be done.
    BlockingCall unlocked;
    CYX_CUDA(synchronize(t.device().index));
  }
  auto holder = std::make_unique<Export>();
  holder->tensor = t;
  holder->consumerStream = consumerStream;
  holder->shape.assign(t.shape().begin(), t.shape().end());
  DLTensor& dl = holder->managed.dl_tensor;
  dl.data = t.rawData();
  dl.device = t.isCuda() ? DLDevice{kDLCUDA, t.device().index} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(holder->shape.size());
  dl.dtype = dlType(t.dtype());
  dl.shape = holder->shape.data();
  dl.strides = nullptr;  // engine tensors are C-contiguous
  dl.byte_offset = 0;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = deleteExport;
  PyObject* capsule = PyCapsule_New(&holder->managed, kCapsule, destroyCapsule);
  if (!capsule) throw py::error_already_set();
  holder.release();  // owned by the capsule, then by the consumer
  return py::reinterpret_steal<py::capsule>(capsule);
}

Tensor fromDLPack(py::handle obj, const char* what) {
  if (!py::hasattr(obj, "__dlpack__") || !py::hasattr(obj, "__dlpack_device__")) {
    throw TypeMismatch(makeString(what, ": expected an object with __dlpack__ and __dlpack_device__ (a numpy array, ",
                                  "a torch or CuPy tensor, a JAX array), got ", py::str(py::type::of(obj)).cast<std::string>()));
  }
  auto device = obj.attr("__dlpack_device__")().cast<py::tuple>();
  const int type = device[0].cast<int>();
  const int index = device[1].cast<int>();
  CYX_CHECK(type == kDLCPU || type == kDLCUDA, what, ": DLPack device type ", type,
            " is neither the host (1) nor a CUDA GPU (2); copy the array to one of them first");
  // For CUDA, the producer makes the named stream wait for its work; our compute stream then waits
  // for that stream (below), without blocking the host.
  py::object capsuleObj = type == kDLCUDA ? obj.attr("__dlpack__")(py::arg("stream") = kLegacyDefaultStream)
                                          : obj.attr("__dlpack__")();
  PyObject* capsule = capsuleObj.ptr();
  CYX_CHECK(PyCapsule_IsValid(capsule, kCapsule), what, ": __dlpack__ returned ",
            py::str(py::type::of(capsuleObj)).cast<std::string>(), ", not an unconsumed \"dltensor\" capsule");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
  // From here the DLManagedTensor is ours: its deleter runs when the tensor's storage is released.
  PyCapsule_SetName(capsule, kUsedCapsule);
  std::shared_ptr<void> owner(managed, [](void* p) { releaseWithGil(&releaseManaged, p); });
  const DLTensor& dl = managed->dl_tensor;
  DType dtype;
  if (dl.dtype.lanes != 1) {
    throw TypeMismatch(makeString(what, ": vector dtypes (", int(dl.dtype.lanes), " lanes) are not supported"));
  } else if (dl.dtype.code == kDLFloat && dl.dtype.bits == 32) {
    dtype = DType::Float32;
  } else if (dl.dtype.code == kDLFloat && dl.dtype.bits == 64) {
    dtype = DType::Float64;
  } else if (dl.dtype.code == kDLInt && dl.dtype.bits == 32) {
    dtype = DType::Int32;
  } else if (dl.dtype.code == kDLInt && dl.dtype.bits == 64) {
    dtype = DType::Int64;
  } else {
    throw TypeMismatch(makeString(what, ": DLPack dtype (code ", int(dl.dtype.code), ", ", int(dl.dtype.bits),
                                  " bits) is not supported; use float32, float64, int32 or int64"));
  }
  Shape shape(dl.shape, dl.shape + dl.ndim);
  if (dl.strides) {
    int64_t expected = 1;
    for (int32_t i = dl.ndim; i-- > 0;) {
      if (shape[i] > 1 && dl.strides[i] != expected) {
        throw InvalidArgument(makeString(what, ": the array is not C-contiguous; pass a contiguous copy"));
      }
      expected *= shape[i];
    }
  }
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  if (type == kDLCUDA) {
    device::check(device::cudaApi().computeWaitsForStream(index, kLegacyDefaultStream));
    return Tensor::fromExternal(data, shape, dtype, device::releasedAfterCompute(index, std::move(owner)),
                                Device{DeviceType::CUDA, index});
  }
  return Tensor::fromExternal(data, shape, dtype, std::move(owner));
}

}  // namespace cyxwiz::bindings
