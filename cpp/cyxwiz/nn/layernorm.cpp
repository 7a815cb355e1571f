#include "cyxwiz/nn/layernorm.h"

#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/parallel.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/lanes.h"
#include "cyxwiz/platform/cpu.h"

namespace cyxwiz::nn {

namespace {

std::string shapeText(const Shape& s) {
  if (s.size() == 1) return std::to_string(s[0]);
  return shapeString(s);
}

// The per-row loops, cloned per instruction set. Each row's sums run in double over lanes
// (lanes.h), then the tail: at d 128 the sequential sums took 6% of a Transformer step.

// Mean and sum of squared deviations of one row (two passes: no cancellation).
CYXWIZ_CPU_CLONES void moments(const float* __restrict x, int64_t D, double* mean, double* squares) {
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= D; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j];
  }
  double sum = laneTotal(lanes);
  for (; i < D; ++i) sum += x[i];
  const double m = sum / static_cast<double>(D);
  double deviations[kLanes] = {};
  for (i = 0; i + kLanes <= D; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) deviations[j] += (x[i + j] - m) * (x[i + j] - m);
  }
  double q = laneTotal(deviations);
  for (; i < D; ++i) q += (x[i] - m) * (x[i] - m);
  *mean = m;
  *squares = q;
}

CYXWIZ_CPU_CLONES void normalize(const float* __restrict x, const float* __restrict w, const float* __restrict b,
                                 float m, float rstd, float* __restrict y, int64_t D) {
  for (int64_t i = 0; i < D; ++i) y[i] = (x[i] - m) * rstd * w[i] + b[i];
}

// The row's terms of the parameters' gradients, added into the column sums dw and db (double).
CYXWIZ_CPU_CLONES void addParamGrads(const float* __restrict x, const float* __restrict g, float m, float rstd,
                                     double* __restrict dw, double* __restrict db, int64_t D) {
  for (int64_t i = 0; i < D; ++i) {
    dw[i] += static_cast<double>(g[i]) * ((x[i] - m) * rstd);
    db[i] += g[i];
  }
}

// dx = rstd (gw - mean(gw) - xhat mean(gw xhat)) for one row, gw = g * weight.
CYXWIZ_CPU_CLONES void inputGrad(const float* __restrict x, const float* __restrict g, const float* __restrict w, float m,
                                 float rstd, float* __restrict dx, int64_t D) {
  double gws[kLanes] = {}, gwXhats[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= D; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const double gw = static_cast<double>(g[i + j]) * w[i + j];
      gws[j] += gw;
      gwXhats[j] += gw * ((x[i + j] - m) * rstd);
    }
  }
  double sumGw = laneTotal(gws), sumGwXhat = laneTotal(gwXhats);
  for (; i < D; ++i) {
    const double gw = static_cast<double>(g[i]) * w[i];
    sumGw += gw;
    sumGwXhat += gw * ((x[i] - m) * rstd);
  }
  const float meanGw = static_cast<float>(sumGw / static_cast<double>(D));
  const float meanGwXhat = static_cast<float>(sumGwXhat / static_cast<double>(D));
  for (i = 0; i < D; ++i) {
    const float xhat = (x[i] - m) * rstd;
    dx[i] = rstd * (g[i] * w[i] - meanGw - xhat * meanGwXhat);
  }
}

}  // namespace

LayerNormModule::LayerNormModule(Shape normalizedShape, double eps) : shape_(std::move(normalizedShape)), eps_(eps) {
  CYX_CHECK(!shape_.empty(), "LayerNormModule: normalized_shape must name at least one dimension");
  width_ = 1;
  for (int64_t d : shape_) {
    CYX_CHECK(d > 0, "LayerNormModule(", shapeText(shape_), "): every dimension of normalized_shape must be positive");
    width_ *= d;
  }
  CYX_CHECK(eps > 0 && std::isfinite(eps), "LayerNormModule(", shapeText(shape_), ", eps=", eps, "): eps must be positive");
  weight_ = {"weight", Tensor::empty(shape_), Tensor::zeros(shape_)};
  weight_.value.fill(1.0);
  bias_ = {"bias", Tensor::zeros(shape_), Tensor::zeros(shape_)};
}

Shape LayerNormModule::outputShape(const Shape& input) const {
  if (input.empty()) return input;
  bool ok = input.size() >= shape_.size() + 1;
  for (size_t i = 0; ok && i < shape_.size(); ++i) {
    const int64_t d = input[input.size() - shape_.size() + i];
    ok = d < 0 || d == shape_[i];
  }
  if (!ok) {
    throw InvalidArgument(makeString(repr(), " normalises the trailing dimensions ", shapeString(shape_), " of (N, ..., ",
                                     shapeText(shape_), "), got ", describeShape(input)));
  }
  return input;
}

Tensor LayerNormModule::forward(const Tensor& input) {
  if (input.dtype() != DType::Float32) {
    throw TypeMismatch(makeString(repr(), ".forward: expected float32 input, got ", dtypeName(input.dtype())));
  }
  outputShape(input.shape());
  if (weight_.value.isCuda()) return forwardGpu(input);
  CYX_CHECK(!input.isCuda(), repr(), ".forward: the input is on ", input.device().str(),
            " and the parameters on the CPU; move the model (model.to) or the input to one device");
  gpuMean_ = gpuRstd_ = Tensor();
  const int64_t rows = input.numel() / width_, D = width_;
  mean_.assign(static_cast<size_t>(rows), 0.0f);
  rstd_.assign(static_cast<size_t>(rows), 0.0f);
  Tensor output = Tensor::empty(input.shape());
  const float* x = input.data<float>();
  const float* w = weight_.value.data<float>();
  const float* b = bias_.value.data<float>();
  float* y = output.data<float>();
  parallelFor(rows, grainOf(D), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      double mean = 0.0, squares = 0.0;
      moments(x + r * D, D, &mean, &squares);
      const float m = static_cast<float>(mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(D) + eps_));
      mean_[static_cast<size_t>(r)] = m;
      rstd_[static_cast<size_t>(r)] = rstd;
      normalize(x + r * D, w, b, m, rstd, y + r * D, D);
    }
  });
  input_ = keepForBackward(input);
  return output;
}

Tensor LayerNormModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (input_.isCuda()) return backwardGpu(gradOutput);
  const int64_t rows = input_.numel() / width_, D = width_;
  const float* x = input_.data<float>();
  const float* g = gradOutput.data<float>();
  const float* w = weight_.value.data<float>();
  // Parameter gradients: sums over the rows, column by column, in double (threads take columns).
  std::vector<double> dw(static_cast<size_t>(D), 0.0), db(static_cast<size_t>(D), 0.0);
  parallelFor(D, columnGrain(rows), [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < rows; ++r) {
      addParamGrads(x + r * D + c0, g + r * D + c0, mean_[static_cast<size_t>(r)], rstd_[static_cast<size_t>(r)],
                    dw.data() + c0, db.data() + c0, c1 - c0);
    }
  });
  float* dW = weight_.grad.data<float>();
  float* dB = bias_.grad.data<float>();
  for (int64_t i = 0; i < D; ++i) {
    dW[i] += static_cast<float>(dw[static_cast<size_t>(i)]);
    dB[i] += static_cast<float>(db[static_cast<size_t>(i)]);
  }
  gradsReady();
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(input_.shape());
  float* dx = gradInput.data<float>();
  parallelFor(rows, grainOf(D), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      inputGrad(x + r * D, g + r * D, w, mean_[static_cast<size_t>(r)], rstd_[static_cast<size_t>(r)], dx + r * D, D);
    }
  });
  return gradInput;
}

// The CPU path's math on the device (kernel_math.h): mean and rstd per row kept as float tensors.
Tensor LayerNormModule::forwardGpu(const Tensor& input) {
  const Device device = weight_.value.device();
  const Tensor x = input.to(device);  // numpy input of a GPU layer: copied once, here at the edge
  const int64_t rows = x.numel() / width_;
  mean_.clear();
  rstd_.clear();
  gpuMean_ = Tensor::empty({rows}, DType::Float32, device);
  gpuRstd_ = Tensor::empty({rows}, DType::Float32, device);
  Tensor output = Tensor::empty(x.shape(), DType::Float32, device);
  CYX_CUDA(layerNormForward(device.index, x.deviceData<float>(), weight_.value.deviceData<float>(),
                            bias_.value.deviceData<float>(), output.deviceData<float>(), gpuMean_.deviceData<float>(),
                            gpuRstd_.deviceData<float>(), rows, width_, eps_));
  input_ = keepForBackward(x);
  return output;
}

// dweight and dbias accumulate (deterministic chunked sums in double); then dx when wanted.
Tensor LayerNormModule::backwardGpu(const Tensor& gradOutput) {
  const Device device = input_.device();
  const Tensor g = gradOutput.to(device);
  const int64_t rows = input_.numel() / width_;
  const float* x = input_.deviceData<float>();
  const float* dy = g.deviceData<float>();
  CYX_CUDA(layerNormBackward(device.index, x, dy, weight_.value.deviceData<float>(), gpuMean_.deviceData<float>(),
                             gpuRstd_.deviceData<float>(), nullptr, weight_.grad.deviceData<float>(),
                             bias_.grad.deviceData<float>(), rows, width_));
  gradsReady();
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(input_.shape(), DType::Float32, device);
  CYX_CUDA(layerNormBackward(device.index, x, dy, weight_.value.deviceData<float>(), gpuMean_.deviceData<float>(),
                             gpuRstd_.deviceData<float>(), gradInput.deviceData<float>(), nullptr, nullptr, rows,
                             width_));
  return gradInput;
}

ModuleSpec LayerNormModule::spec() const {
  ModuleSpec s{typeName(), {{"dims", double(shape_.size())}, {"eps", eps_}}};
  for (size_t i = 0; i < shape_.size(); ++i) s.attrs["dim" + std::to_string(i)] = double(shape_[i]);
  return s;
}

std::string LayerNormModule::repr() const {
  return makeString("LayerNormModule(", shapeText(shape_), ", eps=", eps_, ")");
}

}  // namespace cyxwiz::nn
