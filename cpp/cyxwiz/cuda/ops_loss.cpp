// The ApiImpl methods of softmax, the losses and the correct count (kernels_loss.cu): argument
// checks, the device's compute stream, the launches (launch.h) and their status.
#include <mutex>
#include <string>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

Status targetMissing(const char* who, int dev) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": neither labels nor probs was given";
}

}  // namespace

Status ApiImpl::softmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchSoftmaxForward(s->compute, x, y, rows, cols);
  return launchStatus("softmaxForwardKernel", dev);
}

Status ApiImpl::softmaxBackward(int dev, const float* y, const float* g, float* dx, int64_t rows,
                                int64_t cols) noexcept {
  if (rows <= 0 || cols <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchSoftmaxBackward(s->compute, y, g, dx, rows, cols);
  return launchStatus("softmaxBackwardKernel", dev);
}

Status ApiImpl::crossEntropyForward(int dev, const float* logits, const int64_t* labels, const float* probs,
                                    int64_t rows, int64_t classes, int64_t ignoreIndex, double scale,
                                    double* sum) noexcept {
  if (!labels && !probs) return targetMissing("crossEntropyForward", dev);
  if (rows <= 0 || classes <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  // The partials are shared by every reduction of this device. They run in order on the compute
  // stream; the lock keeps another thread's reduction from being enqueued between our two kernels.
  std::lock_guard<std::mutex> lock(s->mutex);
  const int blocks = launchCrossEntropyPartials(s->compute, logits, labels, probs, rows, classes, ignoreIndex,
                                                s->scratch->partial, kMaxPartials);
  CX_TRY(launchStatus("crossEntropyForwardKernel", dev));
  launchFinishSum(s->compute, s->scratch->partial, blocks, scale, sum);
  return launchStatus("finishSumKernel", dev);
}

Status ApiImpl::crossEntropyBackward(int dev, const float* logits, const int64_t* labels, const float* probs,
                                     float* grad, int64_t rows, int64_t classes, int64_t ignoreIndex) noexcept {
  if (!labels && !probs) return targetMissing("crossEntropyBackward", dev);
  if (rows <= 0 || classes <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  const float invRows = 1.0f / static_cast<float>(rows);
  if (!labels || ignoreIndex == kNoIgnoreIndex) {
    launchCrossEntropyBackward(s->compute, logits, labels, probs, grad, rows, classes, kNoIgnoreIndex, invRows,
                               nullptr);
    return launchStatus("crossEntropyBackwardKernel", dev);
  }
  // The mean's count depends on the labels: counted into the shared scratch, read by the backward kernel
  // (the lock keeps another reduction from landing between the two).
  std::lock_guard<std::mutex> lock(s->mutex);
  launchCountLabels(s->compute, labels, rows, ignoreIndex, s->scratch->count);
  CX_TRY(launchStatus("countLabelsKernel", dev));
  launchCrossEntropyBackward(s->compute, logits, labels, probs, grad, rows, classes, ignoreIndex, invRows,
                             s->scratch->count);
  return launchStatus("crossEntropyBackwardKernel", dev);
}

Status ApiImpl::mseForward(int dev, const float* y, const float* t, int64_t n, double scale, double* sum) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  std::lock_guard<std::mutex> lock(s->mutex);
  const int blocks = launchSquaredErrorPartials(s->compute, y, t, n, s->scratch->partial, kMaxPartials);
  CX_TRY(launchStatus("squaredErrorKernel", dev));
  launchFinishSum(s->compute, s->scratch->partial, blocks, scale, sum);
  return launchStatus("finishSumKernel", dev);
}

Status ApiImpl::mseBackward(int dev, const float* y, const float* t, float* grad, int64_t n) noexcept {
  if (n <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchMseBackward(s->compute, y, t, grad, n, 2.0f / static_cast<float>(n));
  return launchStatus("mseBackwardKernel", dev);
}

Status ApiImpl::countCorrect(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                             int64_t classes, int64_t ignoreIndex, double* sum) noexcept {
  if (!labels && !probs) return targetMissing("countCorrect", dev);
  if (rows <= 0 || classes <= 0) return {};
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  std::lock_guard<std::mutex> lock(s->mutex);
  const int blocks = launchCountCorrectPartials(s->compute, logits, labels, probs, rows, classes, ignoreIndex,
                                                s->scratch->count, kMaxPartials);
  CX_TRY(launchStatus("countCorrectKernel", dev));
  launchFinishCount(s->compute, s->scratch->count, blocks, sum);
  return launchStatus("finishCountKernel", dev);
}

}  // namespace cyxwiz::cuda
