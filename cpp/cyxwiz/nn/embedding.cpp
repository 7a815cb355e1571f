#include "cyxwiz/nn/embedding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cyxwiz/common/error.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

namespace {

// Flat index -> "(n, t)" in `shape`.
std::string position(int64_t flat, const Shape& shape) {
  std::vector<int64_t> at(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    at[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shapeString(at);
}

}  // namespace

EmbeddingModule::EmbeddingModule(int64_t numEmbeddings, int64_t embeddingDim) : num_(numEmbeddings), dim_(embeddingDim) {
  CYX_CHECK(numEmbeddings > 0 && embeddingDim > 0, "EmbeddingModule(num_embeddings=", numEmbeddings, ", embedding_dim=",
            embeddingDim, "): both must be positive");
  weight_ = {"weight", Tensor::empty({num_, dim_}), Tensor::zeros({num_, dim_})};
  fillNormal(weight_.value.data<float>(), weight_.value.numel(), globalGenerator());  // torch: N(0, 1)
}

Shape EmbeddingModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, -1, dim_};
  Shape out = input;
  out.push_back(dim_);
  return out;
}

// Element i of the ids as a row index, or throws naming the id, its position and the vocabulary (the
// CPU's loop, and the GPU path's report of the first invalid position its kernel found).
int64_t EmbeddingModule::checkedId(const Tensor& ids, int64_t i, const void* element) const {
  const std::string who = repr() + ".forward";
  int64_t id;
  switch (ids.dtype()) {
    case DType::Int64: id = *static_cast<const int64_t*>(element); break;
    case DType::Int32: id = *static_cast<const int32_t*>(element); break;
    case DType::Float32: {
      const float v = *static_cast<const float*>(element);
      CYX_CHECK(std::floor(v) == v, who, ": token id ", v, " at position ", position(i, ids.shape()),
                " is not an integer; pass the ids as an integer array");
      // Range-checked as a float first: casting one beyond int64 would be undefined.
      id = v >= 0.0f && v < static_cast<float>(num_) ? static_cast<int64_t>(v) : -1;
      CYX_CHECK(id >= 0, who, ": token id ", v, " at position ", position(i, ids.shape()),
                " is outside the vocabulary [0, ", num_, ")");
      break;
    }
    default:
      throw TypeMismatch(makeString(who, ": token ids must be integers (int64, int32) or float32 holding integers, got ",
                                    dtypeName(ids.dtype())));
  }
  if (id < 0 || id >= num_) {
    throw InvalidArgument(makeString(who, ": token id ", id, " at position ", position(i, ids.shape()),
                                     " is outside the vocabulary [0, ", num_, ")"));
  }
  return id;
}

Tensor EmbeddingModule::forward(const Tensor& input) {
  CYX_CHECK(input.dim() >= 1, repr(), ".forward: expected token ids of shape (N, T) or (N,), got a scalar");
  if (weight_.value.isCuda()) return forwardGpu(input);
  CYX_CHECK(!input.isCuda(), repr(), ".forward: the ids are on ", input.device().str(),
            " and the table on the CPU; move the model (model.to) or the ids to one device");
  gpuIds_ = Tensor();
  const int64_t n = input.numel();
  ids_.resize(static_cast<size_t>(n));
  const size_t size = itemSize(input.dtype());
  const char* raw = static_cast<const char*>(input.rawData());
  for (int64_t i = 0; i < n; ++i) {
    try {
      ids_[static_cast<size_t>(i)] = checkedId(input, i, raw + static_cast<size_t>(i) * size);
    } catch (...) {
      ids_.clear();
      throw;
    }
  }
  idsShape_ = input.shape();
  Tensor output = Tensor::empty(outputShape(input.shape()));
  const float* w = weight_.value.data<float>();
  float* y = output.data<float>();
  for (int64_t i = 0; i < n; ++i) std::memcpy(y + i * dim_, w + ids_[static_cast<size_t>(i)] * dim_, dim_ * sizeof(float));
  return output;
}

Tensor EmbeddingModule::backward(const Tensor& gradOutput) {
  if (idsShape_.empty()) throw InvalidArgument(repr() + ".backward called before forward; run forward on the batch first");
  const Shape expected = outputShape(idsShape_);
  if (gradOutput.dtype() != DType::Float32 || gradOutput.shape() != expected) {
    throw InvalidArgument(makeString(repr(), ".backward: expected a float32 gradient of shape ", shapeString(expected),
                                     ", got ", dtypeName(gradOutput.dtype()), " ", shapeString(gradOutput.shape())));
  }
  if (gpuIds_.defined()) return backwardGpu(gradOutput);
  const float* g = gradOutput.data<float>();
  float* dw = weight_.grad.data<float>();
  // In position order: a repeated id sums its gradients in a fixed order.
  for (size_t i = 0; i < ids_.size(); ++i) {
    float* row = dw + ids_[i] * dim_;
    const float* gi = g + static_cast<int64_t>(i) * dim_;
    for (int64_t d = 0; d < dim_; ++d) row[d] += gi[d];
  }
  gradsReady();
  return Tensor();
}

ModuleSpec EmbeddingModule::spec() const {
  return {typeName(), {{"num_embeddings", double(num_)}, {"embedding_dim", double(dim_)}}};
}

std::string EmbeddingModule::repr() const { return makeString("EmbeddingModule(", num_, ", ", dim_, ")"); }

}  // namespace cyxwiz::nn
