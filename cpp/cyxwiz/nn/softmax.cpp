#include "cyxwiz/nn/softmax.h"

#include <algorithm>
#include <cmath>

#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/nn/elementwise.h"

namespace cyxwiz::nn {

void softmaxRows(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = *std::max_element(xr, xr + cols);
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      yr[c] = std::exp(xr[c] - mx);
      sum += yr[c];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}

namespace {

Tensor softmax(const Tensor& input) {
  Tensor out = Tensor::empty(input.shape(), DType::Float32, input.device());
  const int64_t cols = input.size(-1);
  if (cols == 0) return out;
  if (input.isCuda()) {
    CYX_CUDA(softmaxForward(input.device().index, input.deviceData<float>(), out.deviceData<float>(),
                            input.numel() / cols, cols));
  } else {
    softmaxRows(input.data<float>(), out.data<float>(), input.numel() / cols, cols);
  }
  return out;
}

}  // namespace

Tensor SoftmaxModule::forward(const Tensor& input) {
  requireFloatTensor(input, "SoftmaxModule.forward");
  input_ = keepForBackward(input);
  return softmax(input);
}

Tensor SoftmaxModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (!needInputGrad_) return Tensor();
  Tensor output = softmax(input_);  // recomputed: the returned output belongs to the caller
  Tensor gradInput = Tensor::empty(gradOutput.shape(), DType::Float32, gradOutput.device());
  const int64_t cols = output.size(-1);
  const int64_t rows = cols ? output.numel() / cols : 0;
  if (gradOutput.isCuda()) {
    ops::requireSameDevice(output, gradOutput, "SoftmaxModule.backward");
    if (rows) {
      CYX_CUDA(softmaxBackward(gradOutput.device().index, output.deviceData<float>(), gradOutput.deviceData<float>(),
                               gradInput.deviceData<float>(), rows, cols));
    }
    return gradInput;
  }
  const float* y = output.data<float>();
  const float* g = gradOutput.data<float>();
  float* dx = gradInput.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* gr = g + r * cols;
    double dot = 0.0;
    for (int64_t c = 0; c < cols; ++c) dot += double(gr[c]) * yr[c];
    for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = yr[c] * (gr[c] - static_cast<float>(dot));
  }
  return gradInput;
}

}  // namespace cyxwiz::nn
