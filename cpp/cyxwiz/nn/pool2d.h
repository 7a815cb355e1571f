// Pooling over (N, C, H, W): MaxPool2DModule and AvgPool2DModule (torch's MaxPool2d / AvgPool2d with
// ceil_mode=False; AvgPool2d counts the zero padding, count_include_pad=True as torch's default) and
// GlobalAvgPool2DModule, (N, C, H, W) -> (N, C). No parameters. They run where their input is: a GPU
// input goes to cuDNN's pooling (cuda/api.h poolForward), which needs the forward's input and output
// again in backward.
#pragma once

#include "cyxwiz/cuda/api.h"
#include "cyxwiz/nn/conv2d.h"

namespace cyxwiz::nn {

class Pool2DModule : public Module {
 public:
  // stride {0, 0}: the pool size, as torch's stride=None.
  Pool2DModule(bool max, Pair pool, Pair stride, Pair padding);

  std::string typeName() const override { return max_ ? "MaxPool2DModule" : "AvgPool2DModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;

  Pair poolSize() const { return pool_; }
  Pair stride() const { return stride_; }
  Pair padding() const { return padding_; }

 protected:
  void clearCache() override {
    inputShape_.clear();
    argmax_.clear();
    gpuInput_ = gpuOutput_ = Tensor();
  }

 private:
  cuda::PoolShape cudaShape(const Shape& input) const;

  bool max_;
  Pair pool_, stride_, padding_;
  Shape inputShape_;             // of the last forward; empty before it
  std::vector<int32_t> argmax_;  // max pooling: per output, the index of its maximum in the input plane
  Tensor gpuInput_, gpuOutput_;  // the forward's on a GPU
};

class MaxPool2DModule : public Pool2DModule {
 public:
  explicit MaxPool2DModule(Pair pool, Pair stride = {0, 0}, Pair padding = {0, 0}) : Pool2DModule(true, pool, stride, padding) {}
};

class AvgPool2DModule : public Pool2DModule {
 public:
  explicit AvgPool2DModule(Pair pool, Pair stride = {0, 0}, Pair padding = {0, 0}) : Pool2DModule(false, pool, stride, padding) {}
};

class GlobalAvgPool2DModule : public Module {
 public:
  std::string typeName() const override { return "GlobalAvgPool2DModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  Shape outputShape(const Shape& input) const override;

 protected:
  void clearCache() override {
    inputShape_.clear();
    gpuInput_ = gpuOutput_ = Tensor();
  }

 private:
  Shape inputShape_;
  Tensor gpuInput_, gpuOutput_;  // the forward's on a GPU, (N, C, H, W) and (N, C, 1, 1)
};

// FlattenModule: (N, d1, d2, ...) -> (N, d1*d2*...), a view; torch.nn.Flatten().
class FlattenModule : public Module {
 public:
  std::string typeName() const override { return "FlattenModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  Shape outputShape(const Shape& input) const override;

 protected:
  void clearCache() override { inputShape_.clear(); }

 private:
  Shape inputShape_;
};

}  // namespace cyxwiz::nn
