#include "cyxwiz/nn/batchnorm.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/parallel.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::nn {

namespace {

std::mutex reduceMutex;
StatsAllReduce installedReduce;

// f(c) for every channel, split over the threads when there is enough work (`perChannel` values each).
template <typename F>
void forChannels(int64_t channels, int64_t perChannel, F f) {
  parallelFor(channels, std::max<int64_t>(1, 16384 / std::max<int64_t>(perChannel, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) f(c);
  });
}

// Sums in float64 over 8 independent lanes: vectorised, and as exact as the statistics need.
double sum(const float* v, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += v[i + k];
  }
  double s = 0.0;
  for (; i < n; ++i) s += v[i];
  for (double l : lane) s += l;
  return s;
}

double squaredDeviations(const float* v, int64_t n, double mean) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += (v[i + k] - mean) * (v[i + k] - mean);
  }
  double s = 0.0;
  for (; i < n; ++i) s += (v[i] - mean) * (v[i] - mean);
  for (double l : lane) s += l;
  return s;
}

// sum(d * (v - mean))
double deviationDot(const float* d, const float* v, int64_t n, double mean) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += d[i + k] * (v[i + k] - mean);
  }
  double s = 0.0;
  for (; i < n; ++i) s += d[i] * (v[i] - mean);
  for (double l : lane) s += l;
  return s;
}

}  // namespace

void setStatsAllReduce(StatsAllReduce reduce) {
  std::lock_guard<std::mutex> lock(reduceMutex);
  installedReduce = std::move(reduce);
}

BatchNormModule::BatchNormModule(int imageDims, int64_t numFeatures, double eps, double momentum)
    : dims_(imageDims), features_(numFeatures), eps_(eps), momentum_(momentum) {
  CYX_CHECK(numFeatures > 0, typeName(), "(", numFeatures, "): num_features must be positive");
  CYX_CHECK(eps > 0 && std::isfinite(eps), typeName(), "(", numFeatures, ", eps=", eps, "): eps must be positive");
  CYX_CHECK(momentum >= 0 && momentum <= 1, typeName(), "(", numFeatures, ", momentum=", momentum,
            "): momentum must be between 0 and 1");
  weight_ = {"weight", Tensor::empty({features_}), Tensor::zeros({features_})};
  weight_.value.fill(1.0);
  bias_ = {"bias", Tensor::zeros({features_}), Tensor::zeros({features_})};
  runningMean_ = {"running_mean", Tensor::zeros({features_})};
  runningVar_ = {"running_var", Tensor::empty({features_})};
  runningVar_.value.fill(1.0);
  batchesTracked_ = {"num_batches_tracked", Tensor::zeros({}, DType::Int64)};
}

Shape BatchNormModule::outputShape(const Shape& input) const {
  if (input.empty()) return dims_ == 2 ? Shape{-1, features_, -1, -1} : Shape{-1, features_};
  const bool rankOk = dims_ == 2 ? input.size() == 4 : input.size() == 2 || input.size() == 3;
  if (!rankOk || (input[1] >= 0 && input[1] != features_)) {
    throw InvalidArgument(makeString(repr(), " expects input ",
                                     dims_ == 2 ? makeString("(N, ", features_, ", H, W)")
                                                : makeString("(N, ", features_, ") or (N, ", features_, ", L)"),
                                     ", got ", describeShape(input)));
  }
  return input;
}

bool BatchNormModule::reduce(std::vector<double>& values) const {
  return reduce(Tensor::fromExternal(values.data(), {static_cast<int64_t>(values.size())}, DType::Float64, nullptr));
}

bool BatchNormModule::reduce(const Tensor& values) const {
  if (!sync_) return false;
  StatsAllReduce f;
  {
    std::lock_guard<std::mutex> lock(reduceMutex);
    f = installedReduce;
  }
  return f && f(values);
}

Tensor BatchNormModule::forward(const Tensor& input) {
  const std::string who = repr() + ".forward";
  requireInput(input, who, input.dim() >= 2 ? input.dim() : 2, dims_ == 2 ? "(N, C, H, W)" : "(N, C)");
  outputShape(input.shape());
  const int64_t N = input.size(0), C = features_, S = input.numel() / std::max<int64_t>(N * C, 1);
  if (weight_.value.isCuda()) return forwardGpu(input, N, S);
  gpuSums_ = gpuMean_ = gpuInvstd_ = Tensor();
  const float* x = input.data<float>();
  mean_.assign(static_cast<size_t>(C), 0.0);
  invstd_.assign(static_cast<size_t>(C), 0.0);
  batchStats_ = training_;
  if (training_) {
    // Sums per channel, then the count: one message when synchronised.
    std::vector<double> sums(static_cast<size_t>(C + 1), 0.0);
    forChannels(C, N * S, [&](int64_t c) {
      for (int64_t n = 0; n < N; ++n) sums[c] += sum(x + (n * C + c) * S, S);
    });
    sums[C] = static_cast<double>(N * S);
    reduce(sums);
    count_ = sums[C];
    CYX_CHECK(count_ > 1, who, ": expected more than 1 value per channel when training, got input ",
              shapeString(input.shape()), "; use a larger batch or eval()");
    for (int64_t c = 0; c < C; ++c) mean_[c] = sums[c] / count_;
    // Squared deviations from the (global) mean: two passes, as exact as the data allows.
    std::vector<double> squares(static_cast<size_t>(C), 0.0);
    forChannels(C, N * S, [&](int64_t c) {
      for (int64_t n = 0; n < N; ++n) squares[c] += squaredDeviations(x + (n * C + c) * S, S, mean_[c]);
    });
    reduce(squares);
    float* rm = runningMean_.value.data<float>();
    float* rv = runningVar_.value.data<float>();
    for (int64_t c = 0; c < C; ++c) {
      const double var = squares[c] / count_;
      invstd_[c] = 1.0 / std::sqrt(var + eps_);
      rm[c] = static_cast<float>((1.0 - momentum_) * rm[c] + momentum_ * mean_[c]);
      rv[c] = static_cast<float>((1.0 - momentum_) * rv[c] + momentum_ * var * count_ / (count_ - 1.0));
    }
    batchesTracked_.value.data<int64_t>()[0] += 1;
  } else {
    const float* rm = runningMean_.value.data<float>();
    const float* rv = runningVar_.value.data<float>();
    for (int64_t c = 0; c < C; ++c) {
      mean_[c] = rm[c];
      invstd_[c] = 1.0 / std::sqrt(static_cast<double>(rv[c]) + eps_);
    }
  }
  // y = x * scale + shift with scale = w * invstd and shift = b - mean * scale, per channel.
  Tensor output = Tensor::empty(input.shape());
  float* y = output.data<float>();
  const float* w = weight_.value.data<float>();
  const float* b = bias_.value.data<float>();
  forChannels(C, N * S, [&](int64_t c) {
    const double scale = w[c] * invstd_[c];
    const float sc = static_cast<float>(scale), sh = static_cast<float>(b[c] - mean_[c] * scale);
    for (int64_t n = 0; n < N; ++n) {
      const float* v = x + (n * C + c) * S;
      float* out = y + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) out[i] = v[i] * sc + sh;
    }
  });
  input_ = keepForBackward(input);
  return output;
}

Tensor BatchNormModule::forwardGpu(const Tensor& input, int64_t N, int64_t S) {
  const Device device = weight_.value.device();
  const int dev = device.index;
  const int64_t C = features_;
  const Tensor x = input.to(device);
  Tensor mean = Tensor::empty({C}, DType::Float64, device), invstd = Tensor::empty({C}, DType::Float64, device);
  batchStats_ = training_;
  gpuSums_ = Tensor();
  if (training_) {
    // Checked on this rank's rows (the global count is not on the host): synchronised, any rank may hold one.
    CYX_CHECK(sync_ || N * S > 1, repr(), ".forward: expected more than 1 value per channel when training, got input ",
              shapeString(input.shape()), "; use a larger batch or eval()");
    Tensor sums = Tensor::empty({C + 1}, DType::Float64, device), squares = Tensor::empty({C}, DType::Float64, device);
    CYX_CUDA(channelSums(dev, x.deviceData<float>(), N, C, S, sums.deviceData<double>()));
    reduce(sums);
    CYX_CUDA(channelSquaredDeviations(dev, x.deviceData<float>(), N, C, S, sums.deviceData<double>(),
                                      squares.deviceData<double>()));
    reduce(squares);
    CYX_CUDA(batchNormStatistics(dev, C, sums.deviceData<double>(), squares.deviceData<double>(), eps_, momentum_,
                                 runningMean_.value.deviceData<float>(), runningVar_.value.deviceData<float>(),
                                 batchesTracked_.value.deviceData<int64_t>(), mean.deviceData<double>(),
                                 invstd.deviceData<double>()));
    gpuSums_ = sums;
  } else {
    CYX_CUDA(batchNormStatistics(dev, C, nullptr, nullptr, eps_, momentum_, runningMean_.value.deviceData<float>(),
                                 runningVar_.value.deviceData<float>(), nullptr, mean.deviceData<double>(),
                                 invstd.deviceData<double>()));
  }
  Tensor output = Tensor::empty(x.shape(), DType::Float32, device);
  CYX_CUDA(batchNormApply(dev, x.deviceData<float>(), output.deviceData<float>(), N, C, S, weight_.value.deviceData<float>(),
                          bias_.value.deviceData<float>(), mean.deviceData<double>(), invstd.deviceData<double>()));
  gpuMean_ = mean;
  gpuInvstd_ = invstd;
  input_ = keepForBackward(x);
  return output;
}

Tensor BatchNormModule::backwardGpu(const Tensor& gradOutput) {
  const Device device = input_.device();
  const int dev = device.index;
  const int64_t N = input_.size(0), C = features_, S = input_.numel() / std::max<int64_t>(N * C, 1);
  const Tensor g = gradOutput.to(device);
  Tensor gradSums = Tensor::empty({2 * C}, DType::Float64, device);
  CYX_CUDA(batchNormGradSums(dev, input_.deviceData<float>(), g.deviceData<float>(), N, C, S, gpuMean_.deviceData<double>(),
                             gpuInvstd_.deviceData<double>(), gradSums.deviceData<double>(),
                             weight_.grad.deviceData<float>(), bias_.grad.deviceData<float>()));
  gradsReady();
  if (!needInputGrad_) return Tensor();
  if (batchStats_) reduce(gradSums);  // the gradient flows through the statistics of every rank's rows
  Tensor gradInput = Tensor::empty(input_.shape(), DType::Float32, device);
  CYX_CUDA(batchNormBackward(dev, input_.deviceData<float>(), g.deviceData<float>(), gradInput.deviceData<float>(), N, C, S,
                             weight_.value.deviceData<float>(), gpuMean_.deviceData<double>(),
                             gpuInvstd_.deviceData<double>(), gradSums.deviceData<double>(),
                             batchStats_ ? gpuSums_.deviceData<double>() + C : nullptr));
  return gradInput;
}

Tensor BatchNormModule::backward(const Tensor& gradOutput) {
  checkBackward(input_, gradOutput, input_.shape());
  if (input_.isCuda()) return backwardGpu(gradOutput);
  const int64_t N = input_.size(0), C = features_, S = input_.numel() / std::max<int64_t>(N * C, 1);
  const float* x = input_.data<float>();
  const float* g = gradOutput.data<float>();
  // Per channel: sum(dy) and sum(dy * xhat), xhat the normalised input.
  std::vector<double> sums(static_cast<size_t>(2 * C), 0.0);
  forChannels(C, N * S, [&](int64_t c) {
    for (int64_t n = 0; n < N; ++n) {
      const float* v = x + (n * C + c) * S;
      const float* d = g + (n * C + c) * S;
      sums[c] += sum(d, S);
      sums[C + c] += deviationDot(d, v, S, mean_[c]) * invstd_[c];
    }
  });
  float* dw = weight_.grad.data<float>();
  float* db = bias_.grad.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    dw[c] += static_cast<float>(sums[C + c]);
    db[c] += static_cast<float>(sums[c]);
  }
  gradsReady();
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(input_.shape());
  float* dx = gradInput.data<float>();
  const float* w = weight_.value.data<float>();
  if (batchStats_) reduce(sums);  // the gradient flows through the statistics of every rank's rows
  forChannels(C, N * S, [&](int64_t c) {
    const double k = w[c] * invstd_[c];
    // dx = w invstd (dy - mean(dy) - xhat mean(dy xhat)) = a dy + b (x - mean) + c0 per channel, in
    // float (x - mean as the forward took it: no cancellation of large terms).
    const double meanDy = batchStats_ ? sums[c] / count_ : 0.0;
    const double meanDyXhat = batchStats_ ? sums[C + c] / count_ : 0.0;
    const float a = static_cast<float>(k), bx = static_cast<float>(-k * meanDyXhat * invstd_[c]),
                c0 = static_cast<float>(-k * meanDy), m = static_cast<float>(mean_[c]);
    for (int64_t n = 0; n < N; ++n) {
      const float* v = x + (n * C + c) * S;
      const float* d = g + (n * C + c) * S;
      float* out = dx + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) out[i] = a * d[i] + bx * (v[i] - m) + c0;
    }
  });
  return gradInput;
}

ModuleSpec BatchNormModule::spec() const {
  return {typeName(), {{"num_features", double(features_)}, {"eps", eps_}, {"momentum", momentum_}, {"sync", sync_ ? 1.0 : 0.0}}};
}

std::string BatchNormModule::repr() const {
  return makeString(typeName(), "(", features_, ", eps=", eps_, ", momentum=", momentum_, sync_ ? ", sync=True" : "", ")");
}

}  // namespace cyxwiz::nn
