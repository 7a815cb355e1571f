#include "numpy_convert.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/stream_release.h"
#include "gil.h"

namespace cyxwiz::bindings {

namespace {

Shape shapeOf(const py::array& arr) { return Shape(arr.shape(), arr.shape() + arr.ndim()); }

template <typename T, int Flags>
Tensor wrap(py::array_t<T, Flags> arr) {
  void* data = const_cast<void*>(static_cast<const void*>(arr.data()));
  Shape shape = shapeOf(arr);
  return Tensor::fromExternal(data, shape, DTypeOf<T>::value, pythonOwner(std::move(arr)));
}

py::array asNumericArray(py::handle obj, const char* what) {
  py::array arr = py::array::ensure(obj);
  if (!arr) {
    throw TypeMismatch(makeString(what, ": expected a numpy array (or something numpy.asarray accepts), got ",
                                  std::string(py::str(py::type::of(obj).attr("__name__")))));
  }
  char kind = arr.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u') {
    throw TypeMismatch(makeString(what, ": expected a numeric array, got dtype ", std::string(py::str(arr.dtype()))));
  }
  return arr;
}

// A numpy view of a host tensor for the float32/label conversions. Its bfloat16 view would be raw
// bits (uint16), which those conversions would read as integers: refused instead.
py::object numericView(const Tensor& t, const char* what) {
  if (t.dtype() == DType::BFloat16) {
    throw TypeMismatch(makeString(what, ": the model computes in float32 and takes float32, float64 or integer arrays; "
                                  "got a bfloat16 tensor: convert it to float32 first"));
  }
  return toNumpy(t);
}

}  // namespace

bool isCudaArray(py::handle obj);

Tensor floatTensor(py::handle obj, const char* what) {
  py::object view;  // owns the numpy view of a cx.Tensor until wrap() takes its own reference
  if (isCudaArray(obj)) {
    Tensor t = cudaArrayTensor(obj, what);
    if (t.dtype() == DType::Float32) return t;
    throw TypeMismatch(makeString(what, ": expected a float32 GPU array, got ", dtypeName(t.dtype())));
  }
  if (py::isinstance<Tensor>(obj)) {
    Tensor t = obj.cast<Tensor>();
    if (t.dtype() == DType::Float32) return t;
    view = numericView(t, what);
    obj = view;
  }
  py::array arr = asNumericArray(obj, what);
  return wrap(py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(arr));
}

Tensor modelInput(py::handle obj, bool indices, const char* what) {
  if (indices && !py::isinstance<Tensor>(obj) && !isCudaArray(obj)) {
    py::array arr = py::array::ensure(obj);  // a list of ints becomes an integer array
    const char kind = arr ? arr.dtype().kind() : 'f';
    if (kind == 'i' || kind == 'u') {
      return wrap(py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr));
    }
  }
  return floatTensor(obj, what);
}

Tensor lossTargetTensor(bool classIndices, py::handle obj, const char* what) {
  return classIndices ? targetTensor(obj, what) : floatTensor(obj, what);
}

Tensor targetTensor(py::handle obj, const char* what) {
  py::object view;  // as in floatTensor
  // Labels already on a GPU stay there (int64 class indices or float32 rows).
  if (isCudaArray(obj) || (py::isinstance<Tensor>(obj) && obj.cast<Tensor>().isCuda())) {
    Tensor t = isCudaArray(obj) ? cudaArrayTensor(obj, what) : obj.cast<Tensor>();
    if (t.dtype() == DType::Int64 || (t.dim() != 1 && t.dtype() == DType::Float32)) return t;
  }
  if (py::isinstance<Tensor>(obj)) {
    view = numericView(obj.cast<Tensor>(), what);
    obj = view;
  }
  py::array arr = asNumericArray(obj, what);
  const char kind = arr.dtype().kind();
  // Integer arrays of any rank are class indices ((N,), or (N, T) per position of a sequence); float
  // arrays of 2 or more dimensions are one-hot/probability rows.
  if (arr.ndim() != 1 && kind != 'i' && kind != 'u') return floatTensor(arr, what);
  if (kind == 'u' && arr.itemsize() == 8) {
    // uint64 labels above INT64_MAX would wrap to negative numbers in the cast below.
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    for (py::ssize_t i = 0; i < u.size(); ++i) {
      if (u.data()[i] > static_cast<uint64_t>(INT64_MAX)) {
        throw InvalidArgument(makeString(what, ": class label ", u.data()[i], " at index ", i, " is out of range"));
      }
    }
  }
  if (kind != 'f') {
    return wrap(py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr));
  }
  auto values = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
  Tensor out = Tensor::empty({static_cast<int64_t>(values.size())}, DType::Int64);
  int64_t* labels = out.data<int64_t>();
  for (py::ssize_t i = 0; i < values.size(); ++i) {
    double v = values.data()[i];
    if (std::fabs(v) > 9.0e15) {  // beyond 2^53 a float no longer holds a whole label exactly
      throw InvalidArgument(makeString(what, ": class label ", v, " at index ", i, " is out of range"));
    }
    if (!std::isfinite(v) || std::floor(v) != v) {
      throw InvalidArgument(makeString(what, ": class labels must be whole numbers, got ", v, " at index ", i,
                                       "; pass integer class indices, or 2-D one-hot/probability rows"));
    }
    labels[i] = static_cast<int64_t>(v);
  }
  return out;
}

namespace {

// By kind and size, not object identity: unpickled arrays and numpy.longlong carry equal dtypes
// that are distinct objects.
// dtype.isnative, read from the descriptor: the attribute lookup costs about 0.2 us per collective.
bool nativeByteOrder(const py::dtype& dt) {
  const char order = py::detail::array_descriptor_proxy(dt.ptr())->byteorder;
  constexpr char kNative = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? '<' : '>';
  return order == '=' || order == '|' || order == kNative;
}

std::optional<DType> collectiveDType(const py::dtype& dt) {
  if (!nativeByteOrder(dt)) return std::nullopt;
  char kind = dt.kind();
  auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::Float32;
  if (kind == 'f' && size == 8) return DType::Float64;
  if (kind == 'i' && size == 4) return DType::Int32;
  if (kind == 'i' && size == 8) return DType::Int64;
  if (kind == 'f' && size == 2) return DType::Float16;
  if (kind == 'i' && size == 1) return DType::Int8;
  if (kind == 'u' && size == 1) return DType::UInt8;
  if (kind == 'i' && size == 2) return DType::Int16;
  if (kind == 'b' && size == 1) return DType::Bool;
  return std::nullopt;
}

// What cx.Tensor(array) keeps as it is; other numeric arrays become float32 (the engine's type).
std::optional<DType> engineDType(const py::dtype& dt) {
  std::optional<DType> d = collectiveDType(dt);
  if (d == DType::Float32 || d == DType::Float64 || d == DType::Int32 || d == DType::Int64) return d;
  return std::nullopt;
}

std::string typeName(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

// A collective's array and the dtype it carries: its own, or `as` (dtype="bfloat16": the raw bits
// in an array of 2-byte integers, as numpy has no bfloat16).
std::pair<py::array, DType> collectiveArray(py::handle obj, const char* what, std::optional<DType> as) {
  if (!py::isinstance<py::array>(obj)) {
    if (as) {
      throw TypeMismatch(makeString(what, ": dtype=\"", dtypeName(*as), "\" takes a numpy array of its bits (int16 or "
                                    "uint16; from torch: t.view(torch.int16).numpy()), got ", typeName(obj)));
    }
    throw TypeMismatch(makeString(what, ": expected a numpy array, got ", typeName(obj), "; pass numpy.asarray(x, dtype=numpy.float32)"));
  }
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  if (as) {
    const char kind = arr.dtype().kind();
    if ((kind != 'i' && kind != 'u') || static_cast<size_t>(arr.itemsize()) != itemSize(*as) ||
        !nativeByteOrder(arr.dtype())) {
      throw TypeMismatch(makeString(what, ": dtype=\"", dtypeName(*as), "\" takes an array of its bits in int16 or uint16 "
                                    "(from torch: t.view(torch.int16).numpy()), got dtype ", std::string(py::str(arr.dtype()))));
    }
    return {arr, *as};
  }
  std::optional<DType> dtype = collectiveDType(arr.dtype());
  if (!dtype) {
    throw TypeMismatch(makeString(what, ": dtype ", std::string(py::str(arr.dtype())), " is not supported: use float32, "
                                  "float64, float16, int64, int32, int16, int8, uint8 or bool (x.astype(numpy.float32))"));
  }
  return {arr, *dtype};
}

}  // namespace

Tensor fromNumpyAnyDtype(py::handle obj, const char* what) {
  py::array arr = asNumericArray(obj, what);
  // A Tensor hands out writable views, so read-only memory (bytes, frozen arrays) is copied first.
  if (!arr.writeable()) arr = py::array::ensure(py::module_::import("numpy").attr("array")(arr));
  switch (engineDType(arr.dtype()).value_or(DType::Float32)) {
    case DType::Float64: return wrap(py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr));
    case DType::Int32: return wrap(py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(arr));
    case DType::Int64: return wrap(py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr));
    default: break;  // float32, and every other numeric dtype converted to it
  }
  return floatTensor(arr, what);
}


std::optional<DType> dtypeOverride(py::handle dtype, const char* what) {
  if (dtype.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(dtype) && dtype.cast<std::string>() == "bfloat16") return DType::BFloat16;
  throw InvalidArgument(makeString(what, ": dtype=", std::string(py::repr(dtype)), " is not supported: dtype=\"bfloat16\" "
                                   "(an int16/uint16 array of bfloat16 bits) or None (the array's own dtype)"));
}

Tensor inplaceTensor(py::handle obj, const char* what, std::optional<DType> as) {
  // A numpy array, the common case, skips the other probes: isinstance on a bound class calls its
  // metaclass's __instancecheck__ (about 0.3 us per collective).
  const bool numpy = py::isinstance<py::array>(obj);
  if (!numpy && !as && py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (!numpy && !as && isCudaArray(obj)) return cudaArrayTensor(obj, what);
  auto [arr, dtype] = collectiveArray(obj, what, as);
  if (!(arr.flags() & py::array::c_style)) {
    throw InvalidArgument(makeString(what, ": the array is not C-contiguous, so it cannot be updated in place: use "
                                     "a = numpy.ascontiguousarray(a), then copy the result back if needed"));
  }
  if (!arr.writeable()) throw InvalidArgument(makeString(what, ": the array is read-only; pass a writable copy (a.copy())"));
  Shape shape = shapeOf(arr);
  return Tensor::fromExternal(arr.mutable_data(), shape, dtype, pythonOwner(arr));
}

Tensor inputTensor(py::handle obj, const char* what, std::optional<DType> as) {
  const bool numpy = py::isinstance<py::array>(obj);  // as in inplaceTensor
  if (!numpy && !as && py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (!numpy && !as && isCudaArray(obj)) return cudaArrayTensor(obj, what);
  auto [arr, dtype] = collectiveArray(obj, what, as);
  if (!(arr.flags() & py::array::c_style)) arr = py::module_::import("numpy").attr("ascontiguousarray")(arr);
  Shape shape = shapeOf(arr);
  return Tensor::fromExternal(const_cast<void*>(arr.data()), shape, dtype, pythonOwner(arr));
}

py::dtype numpyDType(DType dtype) {
  switch (dtype) {
    case DType::Float32: return py::dtype::of<float>();
    case DType::Float64: return py::dtype::of<double>();
    case DType::Int32: return py::dtype::of<int32_t>();
    case DType::Int64: return py::dtype::of<int64_t>();
    case DType::Float16: return py::dtype("float16");
    case DType::BFloat16: return py::dtype::of<uint16_t>();  // its bits: numpy has no bfloat16
    case DType::Int8: return py::dtype::of<int8_t>();
    case DType::UInt8: return py::dtype::of<uint8_t>();
    case DType::Int16: return py::dtype::of<int16_t>();
    case DType::Bool: return py::dtype::of<bool>();
  }
  throw InvalidArgument(makeString("unknown dtype code ", static_cast<int>(dtype)));
}

std::pair<py::array, Tensor> newArray(const std::vector<py::ssize_t>& shape, DType dtype) {
  py::array arr(numpyDType(dtype), shape);
  Shape s(shape.begin(), shape.end());
  return {arr, Tensor::fromExternal(arr.mutable_data(), s, dtype, pythonOwner(arr))};
}

std::string bufferFormat(DType dtype) {
  switch (dtype) {
    case DType::Float32: return py::format_descriptor<float>::format();
    case DType::Float64: return py::format_descriptor<double>::format();
    case DType::Int32: return py::format_descriptor<int32_t>::format();
    case DType::Int64: return py::format_descriptor<int64_t>::format();
    case DType::Float16: return "e";
    case DType::BFloat16: return py::format_descriptor<uint16_t>::format();  // its bits, as numpyDType
    case DType::Int8: return py::format_descriptor<int8_t>::format();
    case DType::UInt8: return py::format_descriptor<uint8_t>::format();
    case DType::Int16: return py::format_descriptor<int16_t>::format();
    case DType::Bool: return py::format_descriptor<bool>::format();
  }
  throw InvalidArgument(makeString("unknown dtype code ", static_cast<int>(dtype)));
}

py::object toPython(const Tensor& t) {
  if (t.defined() && t.isCuda()) return py::cast(t);
  return toNumpy(t);
}

Tensor cudaArrayTensor(py::handle obj, const char* what) {
  py::dict cai = obj.attr("__cuda_array_interface__");
  auto data = cai["data"].cast<py::tuple>();
  auto ptr = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  Shape shape;
  for (py::handle d : cai["shape"].cast<py::tuple>()) shape.push_back(d.cast<int64_t>());
  const std::string typestr = cai["typestr"].cast<std::string>();
  DType dtype;
  if (typestr == "<f4") dtype = DType::Float32;
  else if (typestr == "<f8") dtype = DType::Float64;
  else if (typestr == "<i4") dtype = DType::Int32;
  else if (typestr == "<i8") dtype = DType::Int64;
  else throw TypeMismatch(makeString(what, ": GPU arrays of type '", typestr, "' are not supported; use float32, float64, int32 or int64"));
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    auto strides = cai["strides"].cast<py::tuple>();
    int64_t expected = static_cast<int64_t>(itemSize(dtype));
    for (size_t i = shape.size(); i-- > 0;) {
      if (shape[i] > 1 && strides[i].cast<int64_t>() != expected) {
        throw InvalidArgument(makeString(what, ": the GPU array is not C-contiguous; pass a contiguous copy "
                                         "(cupy.ascontiguousarray(x) or x.contiguous())"));
      }
      expected *= shape[i];
    }
  }
  int dev = 0;
  if (ptr) {
    device::check(device::cudaApi().pointerDevice(ptr, &dev));
    CYX_CHECK(dev >= 0, what, ": __cuda_array_interface__ points at host memory");
    // Version 3: our kernels must not read the array before the producer's queued writes land.
    if (cai.contains("stream") && !cai["stream"].is_none()) {
      device::check(device::cudaApi().computeWaitsForStream(dev, cai["stream"].cast<uintptr_t>()));
    }
  }
  // The producer may reuse the memory as soon as we let go of it: only after our queued kernels.
  return Tensor::fromExternal(ptr, shape, dtype,
                              device::releasedAfterCompute(dev, pythonOwner(py::reinterpret_borrow<py::object>(obj))),
                              Device{DeviceType::CUDA, dev});
}

bool isCudaArray(py::handle obj) {
  // A numpy array never is: asked first, it skips the probe, whose miss formats an AttributeError
  // (about 1 us, on every collective call).
  if (py::isinstance<py::array>(obj)) return false;
  return !py::isinstance<Tensor>(obj) && py::hasattr(obj, "__cuda_array_interface__");
}

py::object toNumpy(const Tensor& t) {
  if (!t.defined()) return py::none();
  if (t.isCuda()) {
    Tensor host;
    {
      BlockingCall unlocked;
      host = t.to(Device{});
    }
    return toNumpy(host);
  }
  py::dtype dtype = numpyDType(t.dtype());
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (!t.rawData()) return py::array(dtype, shape, {});  // zero elements: nothing to share
  auto* keep = new std::shared_ptr<Storage>(t.storage());
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<Storage>*>(p); });
  return py::array(dtype, shape, {}, t.rawData(), base);
}

}  // namespace cyxwiz::bindings
