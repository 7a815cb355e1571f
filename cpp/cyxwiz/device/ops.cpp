#include "cyxwiz/device/ops.h"

#include <algorithm>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/parallel.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/tensor/blas.h"

namespace cyxwiz::ops {

void gemm(const Device& device, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (device.type == DeviceType::CUDA) {
    CYX_CUDA(gemm(device.index, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
  } else {
    blas::sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

void broadcastRows(const Device& device, const float* row, float* out, int64_t rows, int64_t cols) {
  if (device.type == DeviceType::CUDA) {
    CYX_CUDA(broadcastRows(device.index, row, out, rows, cols));
    return;
  }
  parallelFor(rows, grainOf(cols), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) std::copy(row, row + cols, out + r * cols);
  });
}

void linearForward(const Device& device, const float* x, const float* w, const float* bias, float* y, int64_t rows,
                   int64_t in, int64_t out, bool relu) {
  if (device.type == DeviceType::CUDA) {
    CYX_CUDA(linearForward(device.index, x, w, bias, y, rows, in, out, relu));
    return;
  }
  // Seed each row with the bias, then let the GEMM accumulate onto it (beta = 1): no separate pass.
  if (bias) broadcastRows(device, bias, y, rows, out);
  blas::sgemm(false, true, rows, out, in, 1.0f, x, in, w, in, bias ? 1.0f : 0.0f, y, out);
  if (relu) {
    parallelFor(rows * out, grainOf(1), [&](int64_t first, int64_t last) {
      std::transform(y + first, y + last, y + first, [](float v) { return v > 0.0f ? v : 0.0f; });
    });
  }
}

void addColumnSums(const Device& device, const float* g, float* out, int64_t rows, int64_t cols) {
  if (device.type == DeviceType::CUDA) {
    CYX_CUDA(addColumnSums(device.index, g, out, rows, cols));
    return;
  }
  // Threads take columns, each summed over the rows in order (the same bits at any thread count).
  parallelFor(cols, columnGrain(rows), [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = g + r * cols;
      for (int64_t j = c0; j < c1; ++j) out[j] += row[j];
    }
  });
}

void gpuActivation(const Tensor& x, Tensor& y, cuda::Activation f, float param) {
  CYX_CUDA(activationForward(x.device().index, f, x.deviceData<float>(), y.deviceData<float>(), x.numel(), param));
}

void gpuActivationGrad(const Tensor& x, const Tensor& g, Tensor& dx, cuda::Activation f, float param) {
  requireSameDevice(x, g, "backward");
  CYX_CUDA(activationBackward(g.device().index, f, x.deviceData<float>(), g.deviceData<float>(), dx.deviceData<float>(),
                              g.numel(), param));
}

void requireSameDevice(const Tensor& a, const Tensor& b, const char* who) {
  CYX_CHECK(a.device() == b.device(), who, ": tensors on ", a.device().str(), " and ", b.device().str(),
            " cannot be combined; move the model and its inputs to one device with model.to(...)");
}

}  // namespace cyxwiz::ops
