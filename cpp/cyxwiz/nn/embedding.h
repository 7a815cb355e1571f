// EmbeddingModule: token ids (any shape, e.g. (N, T)) -> their rows of a (num_embeddings,
// embedding_dim) table, (N, T, D), as torch.nn.Embedding. The ids come as int64 or int32, or as
// float32 holding exact integers (the engine's float inputs: a model whose first layer takes ids still
// trains through DistributedTrainer). The weight's gradient is dense, so DDP's buckets take it as any
// other. CPU and GPU kernels (embedding_gpu.cpp: a gather, and a deterministic scatter-add).
#pragma once

#include <vector>

#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

class EmbeddingModule : public Module {
 public:
  EmbeddingModule(int64_t numEmbeddings, int64_t embeddingDim);

  std::string typeName() const override { return "EmbeddingModule"; }
  bool canDecode() const override { return true; }  // acts on each position alone
  Tensor forward(const Tensor& input) override;
  // Adds into the rows of the ids forward saw; ids have no gradient (returns an undefined tensor).
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  bool takesIndices() const override { return true; }

  int64_t numEmbeddings() const { return num_; }
  int64_t embeddingDim() const { return dim_; }

 protected:
  void clearCache() override {
    ids_.clear();
    idsShape_.clear();
    gpuIds_ = Tensor();
  }

 private:
  int64_t num_, dim_;
  Parameter weight_;
  std::vector<int64_t> ids_;  // of the last forward, in order
  Shape idsShape_;
  Tensor gpuIds_;  // the GPU path's: the ids as they came (int64, int32 or float32), on the device

  int64_t checkedId(const Tensor& ids, int64_t i, const void* element) const;
  Tensor forwardGpu(const Tensor& input);
  Tensor backwardGpu(const Tensor& gradOutput);
};

}  // namespace cyxwiz::nn
