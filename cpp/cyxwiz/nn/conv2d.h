// Conv2DModule: a 2-D convolution (cross-correlation, as torch.nn.Conv2d) over (N, C, H, W) input.
// Weight (out_channels, in_channels / groups, kh, kw) and bias (out_channels), torch's layout.
// CPU kernels: oneDNN's when the onednn-cpu-gomp wheel is installed (tensor/dnnl.h), else im2col over
// chunks of samples sized to stay in the cache and one sgemm per group and chunk (nn/im2col.h).
// GPU: cuDNN through the CUDA library (cuda/api.h convForward...), where the layer's weight lives.
#pragma once

#include <array>

#include <optional>
#include <vector>

#include "cyxwiz/nn/im2col.h"
#include "cyxwiz/nn/module.h"
#include "cyxwiz/tensor/dnnl.h"

namespace cyxwiz::nn {

using Pair = std::array<int64_t, 2>;  // (height, width)
std::string pairString(const Pair& p);  // "(3, 3)", as torch prints sizes

class Conv2DModule : public Module {
 public:
  Conv2DModule(int64_t inChannels, int64_t outChannels, Pair kernel, Pair stride = {1, 1}, Pair padding = {0, 0},
               Pair dilation = {1, 1}, int64_t groups = 1, bool bias = true);

  std::string typeName() const override { return "Conv2DModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override;
  ModuleSpec spec() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  std::vector<Tensor> savedTensors() const override { return input_.defined() ? std::vector<Tensor>{input_} : std::vector<Tensor>{}; }

  // Kaiming-uniform weight and uniform bias in +-1/sqrt(fan_in), fan_in = in/groups * kh * kw, as torch.
  void resetParameters();
  int64_t inChannels() const { return in_; }
  int64_t outChannels() const { return out_; }
  Pair kernelSize() const { return kernel_; }
  Pair stride() const { return stride_; }
  Pair padding() const { return padding_; }
  Pair dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }
  bool hasBias() const { return hasBias_; }

 protected:
  void clearCache() override {
    input_ = Tensor();
    half_.reset();
  }

 private:
  ConvGeometry geometry(const Shape& input) const;
  dnnl::ConvShape kernelShape(const Shape& input) const;
  Tensor forwardGpu(const Tensor& input, const Shape& outShape);
  Tensor backwardGpu(const Tensor& gradOutput);
  // The im2col path of backward (without oneDNN, or for a shape it refuses).
  void weightGradsIm2col(const Tensor& gradOutput);
  Tensor inputGradIm2col(const Tensor& gradOutput, const Tensor& weight);
  const float* chunkGradient(const float* go, int64_t first, int64_t count, int64_t P, std::vector<float>& buffer) const;

  int64_t in_, out_;
  Pair kernel_, stride_, padding_, dilation_;
  int64_t groups_;
  bool hasBias_;
  Parameter weight_, bias_;
  Tensor input_;  // backward rebuilds the column matrix from it (less memory than keeping the columns)
  // Under autocast: the 16-bit type the forward rounded its operands to; input_ holds the rounded input,
  // as bfloat16 bits after oneDNN's bfloat16 kernels, else as float32; backward rounds the gradient and
  // the weight alike.
  std::optional<DType> half_;
};

}  // namespace cyxwiz::nn
