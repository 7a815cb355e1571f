// The ApiImpl methods of batch normalisation (kernels_batchnorm.cu): argument checks, the device's
// compute stream, the launches (launch.h) and their status. The reductions are two passes: block
// partials in the device's scratch (or straight into the result when one block per channel), then
// a fixed-order finish per channel.
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

Status invalid(const char* who, int dev, const std::string& what) {
  return std::string(who) + " on cuda:" + std::to_string(dev) + ": " + what;
}

// The first null among the named pointers, as an error; empty when none is.
Status nullArgument(const char* who, int dev, std::initializer_list<std::pair<const char*, const void*>> args) {
  for (const auto& [name, p] : args) {
    if (!p) return invalid(who, dev, std::string(name) + " is null");
  }
  return {};
}

// Negative sizes are errors. The reductions need channels (they write one result each) but accept
// no values: a rank's empty share of a synchronised batch gives zero sums and count, which the
// all-reduce then adds to the others'. Apply and backward of an empty tensor do nothing.
Status badShape(const char* who, int dev, int64_t n, int64_t c, int64_t s, bool reduction) {
  if (n >= 0 && s >= 0 && (reduction ? c > 0 : c >= 0)) return {};
  return invalid(who, dev,
                 "shape (n=" + std::to_string(n) + ", c=" + std::to_string(c) + ", s=" + std::to_string(s) +
                     ") must be non-negative" + (reduction ? " with c > 0" : ""));
}

// A reduction's blocks per channel: 0 when there is nothing to sum (the first pass is skipped and
// the finish, adding no partials, writes zeros).
int splitsFor(int64_t n, int64_t c, int64_t s, int quantities) {
  return n * s == 0 ? 0 : channelSplits(n * s, c, quantities, kMaxPartials);
}

// Where a reduction's first pass writes: the scratch partials when it splits channels over several
// blocks, else the results themselves (the finish then runs in place).
double* partialsFor(DeviceState* s, int splits, double* results) { return splits > 1 ? s->scratch->partial : results; }

}  // namespace

Status ApiImpl::channelSums(int dev, const float* x, int64_t n, int64_t c, int64_t s, double* sums) noexcept {
  CX_TRY(badShape("channelSums", dev, n, c, s, true));
  if (n * s > 0) CX_TRY(nullArgument("channelSums", dev, {{"x", x}}));  // an empty input may have none
  CX_TRY(nullArgument("channelSums", dev, {{"sums", sums}}));
  DeviceState* st = nullptr;
  CX_TRY(useDevice(dev, &st));
  std::lock_guard<std::mutex> lock(st->mutex);  // the scratch partials, between the two launches
  const int splits = splitsFor(n, c, s, 1);
  double* partial = partialsFor(st, splits, sums);
  if (splits > 0) {
    launchChannelSumPartials(st->compute, x, n, c, s, partial, splits);
    CX_TRY(launchStatus("channelSumKernel", dev));
  }
  launchFinishChannelSums(st->compute, partial, splits, c, sums, static_cast<double>(n * s));
  return launchStatus("finishChannelSumsKernel", dev);
}

Status ApiImpl::channelSquaredDeviations(int dev, const float* x, int64_t n, int64_t c, int64_t s, const double* sums,
                                         double* squares) noexcept {
  CX_TRY(badShape("channelSquaredDeviations", dev, n, c, s, true));
  if (n * s > 0) CX_TRY(nullArgument("channelSquaredDeviations", dev, {{"x", x}}));
  CX_TRY(nullArgument("channelSquaredDeviations", dev, {{"sums", sums}, {"squares", squares}}));
  DeviceState* st = nullptr;
  CX_TRY(useDevice(dev, &st));
  std::lock_guard<std::mutex> lock(st->mutex);
  const int splits = splitsFor(n, c, s, 1);
  double* partial = partialsFor(st, splits, squares);
  if (splits > 0) {
    launchChannelSquarePartials(st->compute, x, n, c, s, sums, partial, splits);
    CX_TRY(launchStatus("channelSquareKernel", dev));
  }
  launchFinishChannelSquares(st->compute, partial, splits, c, squares);
  return launchStatus("finishChannelSquaresKernel", dev);
}

Status ApiImpl::batchNormStatistics(int dev, int64_t c, const double* sums, const double* squares, double eps,
                                   double momentum, float* runningMean, float* runningVar, int64_t* batchesTracked,
                                   double* mean, double* invstd) noexcept {
  const char* who = "batchNormStatistics";
  if (c <= 0) return invalid(who, dev, "c=" + std::to_string(c) + " must be positive");
  if (!(eps > 0.0)) return invalid(who, dev, "eps=" + std::to_string(eps) + " must be positive");
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    return invalid(who, dev, "momentum=" + std::to_string(momentum) + " must be between 0 and 1");
  }
  CX_TRY(nullArgument(who, dev,
                      {{"runningMean", runningMean}, {"runningVar", runningVar}, {"mean", mean}, {"invstd", invstd}}));
  if (sums) CX_TRY(nullArgument(who, dev, {{"squares", squares}, {"batchesTracked", batchesTracked}}));
  DeviceState* st = nullptr;
  CX_TRY(useDevice(dev, &st));
  launchBatchNormStatistics(st->compute, c, sums, squares, eps, momentum, runningMean, runningVar, batchesTracked,
                            mean, invstd);
  return launchStatus("batchNormStatisticsKernel", dev);
}

Status ApiImpl::batchNormApply(int dev, const float* x, float* y, int64_t n, int64_t c, int64_t s, const float* weight,
                               const float* bias, const double* mean, const double* invstd) noexcept {
  CX_TRY(badShape("batchNormApply", dev, n, c, s, false));
  if (n == 0 || c == 0 || s == 0) return {};
  CX_TRY(nullArgument("batchNormApply", dev,
                      {{"x", x}, {"y", y}, {"weight", weight}, {"bias", bias}, {"mean", mean}, {"invstd", invstd}}));
  DeviceState* st = nullptr;
  CX_TRY(useDevice(dev, &st));
  launchBatchNormApply(st->compute, x, y, n, c, s, weight, bias, mean, invstd);
  return launchStatus("batchNormApplyKernel", dev);
}

Status ApiImpl::batchNormGradSums(int dev, const float* x, const float* dy, int64_t n, int64_t c, int64_t s,
                                  const double* mean, const double* invstd, double* gradSums, float* dweight,
                                  float* dbias) noexcept {
  CX_TRY(badShape("batchNormGradSums", dev, n, c, s, true));
  if (n * s > 0) CX_TRY(nullArgument("batchNormGradSums", dev, {{"x", x}, {"dy", dy}}));
  CX_TRY(nullArgument("batchNormGradSums", dev, {{"mean", mean}, {"invstd", invstd}, {"gradSums", gradSums}}));
  DeviceState* st = nullptr;
  CX_TRY(useDevice(dev, &st));
  std::lock_guard<std::mutex> lock(st->mutex);
  const int splits = splitsFor(n, c, s, 2);
  double* partial = partialsFor(st, splits, gradSums);
  if (splits > 0) {
    launchBatchNormGradPartials(st->compute, x, dy, n, c, s, mean, partial, splits);
    CX_TRY(launchStatus("batchNormGradPartialsKernel", dev));
  }
  launchFinishBatchNormGrad(st->compute, partial, splits, c, invstd, gradSums, dweight, dbias);
  return launchStatus("finishBatchNormGradKernel", dev);
}

Status ApiImpl::batchNormBackward(int dev, const float* x, const float* dy, float* dx, int64_t n, int64_t c, int64_t s,
                                  const float* weight, const double* mean, const double* invstd,
                                  const double* gradSums, const double* count) noexcept {
  const char* who = "batchNormBackward";
  CX_TRY(badShape(who, dev, n, c, s, false));
  if (n == 0 || c == 0 || s == 0) return {};
  CX_TRY(nullArgument(who, dev,
                      {{"x", x}, {"dy", dy}, {"dx", dx}, {"weight", weight}, {"mean", mean}, {"invstd", invstd}}));
  if (count && !gradSums) return invalid(who, dev, "gradSums is null with batch statistics (count given)");
  DeviceState* st = nullptr;
  CX_TRY(useDevice(dev, &st));
  launchBatchNormBackward(st->compute, x, dy, dx, n, c, s, weight, mean, invstd, gradSums, count);
  return launchStatus("batchNormBackwardKernel", dev);
}

}  // namespace cyxwiz::cuda
