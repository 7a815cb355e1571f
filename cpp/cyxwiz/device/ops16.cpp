#include "cyxwiz/device/ops16.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::ops {

namespace {

// cuda::ElemType has cyxwiz::DType's codes.
cuda::ElemType elemType(DType dtype) { return static_cast<cuda::ElemType>(static_cast<int>(dtype)); }

}  // namespace

Tensor narrowOnDevice(const Tensor& x, DType dtype) {
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  CYX_CUDA(convertFloats(x.device().index, x.deviceData<float>(), cuda::ElemType::Float32, out.rawData(),
                         elemType(dtype), x.numel(), 1.0f));
  return out;
}

void roundOnDevice(Tensor& x, DType dtype) {
  const Tensor x16 = narrowOnDevice(x, dtype);
  CYX_CUDA(convertFloats(x.device().index, x16.rawData(), elemType(dtype), x.deviceData<float>(), cuda::ElemType::Float32,
                         x.numel(), 1.0f));
}

void linearForward16(const Tensor& x16, const Tensor& w16, const float* bias, Tensor& y, bool relu) {
  CYX_CHECK(x16.dtype() == w16.dtype(), "linearForward16: input ", dtypeName(x16.dtype()), " and weight ",
            dtypeName(w16.dtype()), " differ");
  CYX_CUDA(linearForward16(y.device().index, elemType(x16.dtype()), x16.rawData(), w16.rawData(), bias,
                           y.deviceData<float>(), x16.size(0), x16.size(1), w16.size(0), relu));
}

void gemm16(const Device& device, DType dtype, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
            const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb, float beta, float* c, int64_t ldc) {
  CYX_CHECK(a.dtype() == dtype && b.dtype() == dtype, "gemm16: operands ", dtypeName(a.dtype()), " and ",
            dtypeName(b.dtype()), ", expected ", dtypeName(dtype));
  CYX_CUDA(gemm16(device.index, elemType(dtype), transA, transB, m, n, k, alpha, a.rawData(), lda, b.rawData(), ldb,
                  beta, c, ldc));
}

void addColumnSums16(const Tensor& g16, float* out) {
  CYX_CUDA(addColumnSums16(g16.device().index, elemType(g16.dtype()), g16.rawData(), out, g16.size(0), g16.size(1)));
}

void reluBackward16(const Tensor& x16, const Tensor& g, Tensor& dx) {
  CYX_CUDA(reluBackward16(g.device().index, elemType(x16.dtype()), x16.rawData(), g.deviceData<float>(),
                          dx.deviceData<float>(), g.numel()));
}

void scaleOnDevice(int dev, const float* in, float* out, int64_t n, float factor) {
  CYX_CUDA(scaleFloats(dev, in, out, n, factor, nullptr));
}

bool unscaleOnDevice(int dev, const std::vector<FloatSpan>& spans, float factor) {
  const Device device{DeviceType::CUDA, dev};
  const Tensor flag = Tensor::zeros({1}, DType::Float32, device);
  for (const FloatSpan& s : spans) CYX_CUDA(scaleFloats(dev, s.data, s.data, s.n, factor, flag.deviceData<float>()));
  return flag.to(Device{}).data<float>()[0] == 0.0f;  // the one read back, after the kernels
}

}  // namespace cyxwiz::ops
