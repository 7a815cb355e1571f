// The ApiImpl methods of EmbeddingModule (kernels_embedding.cu): argument checks, the device's compute
// stream, the launches (launch.h) and their status.
#include <string>

#include "cyxwiz/cuda/api_impl.h"
#include "cyxwiz/cuda/arguments.h"
#include "cyxwiz/cuda/errors.h"
#include "cyxwiz/cuda/launch.h"
#include "cyxwiz/cuda/state.h"

namespace cyxwiz::cuda {

namespace {

Status checkEmbedding(const char* who, int dev, ElemType idType, int64_t count, int64_t vocab, int64_t dim) {
  if (idType != ElemType::Int64 && idType != ElemType::Int32 && idType != ElemType::Float32) {
    return invalidArgument(who, dev, "ids must be Int64, Int32 or Float32 (ElemType " +
                                         std::to_string(static_cast<int>(idType)) + ")");
  }
  if (count < 0) return invalidArgument(who, dev, "count=" + std::to_string(count) + " is negative");
  return nonPositive(who, dev, {{"vocab", vocab}, {"dim", dim}});
}

}  // namespace

Status ApiImpl::embeddingForward(int dev, const void* ids, ElemType idType, const float* table, float* out,
                                 int64_t count, int64_t vocab, int64_t dim, int64_t* firstBad) noexcept {
  const char* who = "embeddingForward";
  CX_TRY(checkEmbedding(who, dev, idType, count, vocab, dim));
  if (count > 0) CX_TRY(nullArguments(who, dev, {{"ids", ids}, {"table", table}, {"out", out}}));
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  if (count == 0) {
    if (!firstBad) return {};
    return memsetZero(dev, firstBad, sizeof(int64_t));  // no positions: "none bad" is count = 0
  }
  launchEmbeddingForward(s->compute, ids, idType, table, out, count, vocab, dim, firstBad);
  return launchStatus("embeddingForwardKernel", dev);
}

Status ApiImpl::embeddingBackward(int dev, const void* ids, ElemType idType, const float* g, float* dtable,
                                  int64_t count, int64_t vocab, int64_t dim) noexcept {
  const char* who = "embeddingBackward";
  CX_TRY(checkEmbedding(who, dev, idType, count, vocab, dim));
  if (count == 0) return {};
  CX_TRY(nullArguments(who, dev, {{"ids", ids}, {"g", g}, {"dtable", dtable}}));
  DeviceState* s = nullptr;
  CX_TRY(useDevice(dev, &s));
  launchEmbeddingBackward(s->compute, ids, idType, g, dtable, count, vocab, dim);
  return launchStatus("embeddingBackwardKernel", dev);
}

}  // namespace cyxwiz::cuda
