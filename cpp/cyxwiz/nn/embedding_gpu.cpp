// EmbeddingModule on a GPU: embedding.cpp dispatches here when the table is on one. The ids stay on
// the device as they came (int64, int32 or float32); the kernel gathers rows and flags the first
// invalid position in a device int64. An eager forward reads that flag back (an 8-byte copy, which
// waits for the stream) and raises the CPU's error for the id there. Inside a CUDA graph capture
// nothing may wait for the host, so the flag is not read: invalid ids of a replayed step give zero
// rows and no gradient instead of an error (the graphed step's eager warm-up batch is checked).
#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/embedding.h"

namespace cyxwiz::nn {

namespace {

cuda::ElemType idType(DType dtype) {
  switch (dtype) {
    case DType::Int64: return cuda::ElemType::Int64;
    case DType::Int32: return cuda::ElemType::Int32;
    default: return cuda::ElemType::Float32;
  }
}

}  // namespace

Tensor EmbeddingModule::forwardGpu(const Tensor& input) {
  const std::string who = repr() + ".forward";
  if (input.dtype() != DType::Int64 && input.dtype() != DType::Int32 && input.dtype() != DType::Float32) {
    throw TypeMismatch(makeString(who, ": token ids must be integers (int64, int32) or float32 holding integers, got ",
                                  dtypeName(input.dtype())));
  }
  const Device device = weight_.value.device();
  const int dev = device.index;
  ids_.clear();
  gpuIds_ = Tensor();
  idsShape_.clear();
  const Tensor ids = keepForBackward(input.to(device));
  const int64_t n = ids.numel();
  Tensor output = Tensor::empty(outputShape(input.shape()), DType::Float32, device);
  const bool check = !device::cudaApi().capturing(dev);
  Tensor firstBad = check ? Tensor::empty({1}, DType::Int64, device) : Tensor();
  CYX_CUDA(embeddingForward(dev, ids.rawData(), idType(ids.dtype()), weight_.value.deviceData<float>(),
                            output.deviceData<float>(), n, num_, dim_,
                            check ? firstBad.deviceData<int64_t>() : nullptr));
  if (check) {
    const int64_t bad = firstBad.to(Device{}).data<int64_t>()[0];
    if (bad < n) {
      // The one offending element, copied back to name it as the CPU path does (checkedId throws).
      const size_t size = itemSize(ids.dtype());
      int64_t element = 0;
      CYX_CUDA(copy(dev, &element, static_cast<const char*>(ids.rawData()) + static_cast<size_t>(bad) * size, size,
                    cuda::CopyKind::DeviceToHost));
      checkedId(ids, bad, &element);
      throw InvalidArgument(makeString(who, ": the GPU flagged token id position ", bad, " but its id is valid"));
    }
  }
  gpuIds_ = ids;
  idsShape_ = input.shape();
  return output;
}

Tensor EmbeddingModule::backwardGpu(const Tensor& gradOutput) {
  const Device device = gpuIds_.device();
  const Tensor g = gradOutput.to(device);
  CYX_CUDA(embeddingBackward(device.index, gpuIds_.rawData(), idType(gpuIds_.dtype()), g.deviceData<float>(),
                             weight_.grad.deviceData<float>(), gpuIds_.numel(), num_, dim_));
  gradsReady();
  return Tensor();
}

}  // namespace cyxwiz::nn
