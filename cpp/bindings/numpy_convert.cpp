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
    view = toNumpy(t);
    obj = view;
  }
  py::array arr = asNumericArray(obj, what);
  return wrap(py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(arr));
}

Tensor lossTargetTensor(bool classIndices, py::handle obj, const char* what) {
  return classIndices ? targetTensor(obj, what) : floatTensor(obj, what);
}

Tensor targetTensor(py::handle obj, const char* what) {
  py::object view;  // as in floatTensor
  // Labels already on a GPU stay there (int64 class indices or float32 rows).
  if (isCudaArray(obj) || (py::isinstance<Tensor>(obj) && obj.cast<Tensor>().isCuda())) {
    Tensor t = isCudaArray(obj) ? cudaArrayTensor(obj, what) : obj.cast<Tensor>();
    if ((t.dim() == 1 && t.dtype() == DType::Int64) || (t.dim() != 1 && t.dtype() == DType::Float32)) return t;
  }
  if (py::isinstance<Tensor>(obj)) {
    view = toNumpy(obj.cast<Tensor>());
    obj = view;
  }
  py::array arr = asNumericArray(obj, what);
  if (arr.ndim() != 1) return floatTensor(arr, what);
  if (arr.dtype().kind() == 'u' && arr.itemsize() == 8) {
    // uint64 labels above INT64_MAX would wrap to negative numbers in the cast below.
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    for (py::ssize_t i = 0; i < u.size(); ++i) {
      if (u.data()[i] > static_cast<uint64_t>(INT64_MAX)) {
        throw InvalidArgument(makeString(what, ": class label ", u.data()[i], " at index ", i, " is out of range"));
      }
    }
  }
  if (arr.dtype().kind() != 'f') {
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
std::optional<DType> collectiveDType(const py::dtype& dt) {
  if (!dt.attr("isnative").cast<bool>()) return std::nullopt;
  char kind = dt.kind();
  auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::Float32;
  if (kind == 'f' && size == 8) return DType::Float64;
  if (kind == 'i' && size == 4) return DType::Int32;
  if (kind == 'i' && size == 8) return DType::Int64;
  return std::nullopt;
}

py::array collectiveArray(py::handle obj, const char* what) {
  if (!py::isinstance<py::array>(obj)) {
    throw TypeMismatch(makeString(what, ": expected a numpy array, got ", std::string(py::str(py::type::of(obj).attr("__name__"))),
                                  "; pass numpy.asarray(x, dtype=numpy.float32)"));
  }
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  if (!collectiveDType(arr.dtype())) {
    throw TypeMismatch(makeString(what, ": dtype ", std::string(py::str(arr.dtype())),
                                  " is not supported: use float32, float64, int32 or int64 (x.astype(numpy.float32))"));
  }
  return arr;
}

}  // namespace

Tensor fromNumpyAnyDtype(py::handle obj, const char* what) {
  py::array arr = asNumericArray(obj, what);
  // A Tensor hands out writable views, so read-only memory (bytes, frozen arrays) is copied first.
  if (!arr.writeable()) arr = py::array::ensure(py::module_::import("numpy").attr("array")(arr));
  switch (collectiveDType(arr.dtype()).value_or(DType::Float32)) {
    case DType::Float64: return wrap(py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr));
    case DType::Int32: return wrap(py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(arr));
    case DType::Int64: return wrap(py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr));
    case DType::Float32: break;
  }
  return floatTensor(arr, what);
}


Tensor inplaceTensor(py::handle obj, const char* what) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (isCudaArray(obj)) return cudaArrayTensor(obj, what);
  py::array arr = collectiveArray(obj, what);
  if (!(arr.flags() & py::array::c_style)) {
    throw InvalidArgument(makeString(what, ": the array is not C-contiguous, so it cannot be updated in place: use "
                                     "a = numpy.ascontiguousarray(a), then copy the result back if needed"));
  }
  if (!arr.writeable()) throw InvalidArgument(makeString(what, ": the array is read-only; pass a writable copy (a.copy())"));
  Shape shape = shapeOf(arr);
  return Tensor::fromExternal(arr.mutable_data(), shape, *collectiveDType(arr.dtype()), pythonOwner(arr));
}

Tensor inputTensor(py::handle obj, const char* what) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (isCudaArray(obj)) return cudaArrayTensor(obj, what);
  py::array arr = collectiveArray(obj, what);
  if (!(arr.flags() & py::array::c_style)) arr = py::module_::import("numpy").attr("ascontiguousarray")(arr);
  Shape shape = shapeOf(arr);
  return Tensor::fromExternal(const_cast<void*>(arr.data()), shape, *collectiveDType(arr.dtype()), pythonOwner(arr));
}

std::pair<py::array, Tensor> newArray(const std::vector<py::ssize_t>& shape, DType dtype) {
  py::dtype dt;
  switch (dtype) {
    case DType::Float32: dt = py::dtype::of<float>(); break;
    case DType::Float64: dt = py::dtype::of<double>(); break;
    case DType::Int32: dt = py::dtype::of<int32_t>(); break;
    case DType::Int64: dt = py::dtype::of<int64_t>(); break;
  }
  py::array arr(dt, shape);
  Shape s(shape.begin(), shape.end());
  return {arr, Tensor::fromExternal(arr.mutable_data(), s, dtype, pythonOwner(arr))};
}

std::string bufferFormat(DType dtype) {
  switch (dtype) {
    case DType::Float32: return py::format_descriptor<float>::format();
    case DType::Float64: return py::format_descriptor<double>::format();
    case DType::Int32: return py::format_descriptor<int32_t>::format();
    case DType::Int64: return py::format_descriptor<int64_t>::format();
  }
  throw InvalidArgument("unknown dtype");
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
  py::dtype dtype;
  switch (t.dtype()) {
    case DType::Float32: dtype = py::dtype::of<float>(); break;
    case DType::Float64: dtype = py::dtype::of<double>(); break;
    case DType::Int32: dtype = py::dtype::of<int32_t>(); break;
    case DType::Int64: dtype = py::dtype::of<int64_t>(); break;
  }
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (!t.rawData()) return py::array(dtype, shape, {});  // zero elements: nothing to share
  auto* keep = new std::shared_ptr<Storage>(t.storage());
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<Storage>*>(p); });
  return py::array(dtype, shape, {}, t.rawData(), base);
}

}  // namespace cyxwiz::bindings
