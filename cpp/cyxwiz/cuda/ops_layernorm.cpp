// The ApiImpl methods of LayerNormModule (kernels_layernorm.cu): argument checks, the device's
// compute stream, the launches (launch.h) and their status. The parameters' gradients need
// 2 x chunks x dim doubles of partials: stream-ordered memory of the call (so it may be captured).
#include <string>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/arguments.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

Status ApiImpl::layerNormForward(int dev, const float* x, const float* weight, const float* bias, float* y,
                                 float* mean, float* rstd, int64_t rows, int64_t dim, double eps) noexcept {
  const char* who = "layerNormForward";
  CX_TRY(nonPositive(who, dev, {{"dim", dim}}));
  if (!(eps > 0.0)) return invalidArgument(who, dev, "eps=" + std::to_string(eps) + " must be positive");
  if (rows < 0) return invalidArgument(who, dev, "rows=" + std::to_string(rows) + " is negative");
  if (rows == 0) return {};
  CX_TRY(nullArguments(who, dev,
                       {{"x", x}, {"weight", weight}, {"bias", bias}, {"y", y}, {"mean", mean}, {"rstd", rstd}}));
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchLayerNormForward(s->compute, x, weight, bias, y, mean, rstd, rows, dim, eps);
  return launchStatus("layerNormForwardKernel", dev);
}

Status ApiImpl::layerNormBackward(int dev, const float* x, const float* dy, const float* weight, const float* mean,
                                  const float* rstd, float* dx, float* dweight, float* dbias, int64_t rows,
                                  int64_t dim) noexcept {
  const char* who = "layerNormBackward";
  CX_TRY(nonPositive(who, dev, {{"dim", dim}}));
  if (rows < 0) return invalidArgument(who, dev, "rows=" + std::to_string(rows) + " is negative");
  if (rows == 0) return {};
  CX_TRY(nullArguments(who, dev, {{"x", x}, {"dy", dy}, {"mean", mean}, {"rstd", rstd}}));
  if (dx) CX_TRY(nullArguments(who, dev, {{"weight", weight}}));
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (dweight || dbias) {
    const int64_t chunks = layerNormChunks(rows);
    void* partial = nullptr;
    CX_TRY(malloc(dev, static_cast<size_t>(2 * chunks * dim) * sizeof(double), &partial));
    launchLayerNormGradPartials(s->compute, x, dy, mean, rstd, rows, dim, static_cast<double*>(partial));
    Status st = launchStatus("layerNormGradPartialsKernel", dev);
    if (st.empty()) {
      launchFinishLayerNormGrad(s->compute, static_cast<double*>(partial), chunks, dim, dweight, dbias);
      st = launchStatus("finishLayerNormGradKernel", dev);
    }
    free(dev, partial);  // stream-ordered: after the finish
    CX_TRY(st);
  }
  if (!dx) return {};
  launchLayerNormBackwardInput(s->compute, x, dy, weight, mean, rstd, dx, rows, dim);
  return launchStatus("layerNormBackwardInputKernel", dev);
}

}  // namespace cyxwiz::cuda
