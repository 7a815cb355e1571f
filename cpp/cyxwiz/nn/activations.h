// The smooth and leaky activations, element-wise over any shape: LeakyReLUModule,
// ELUModule, SwishModule (SiLU, x * sigmoid(x)) and MishModule (x * tanh(softplus(x))), as torch's.
// On a GPU the CUDA library's activation kernels compute the same formulas (cuda/kernel_math.h).
#pragma once

#include "cyxwiz/cuda/api.h"
#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

// y = f(x) with dy/dx = f'(x); the subclass states f and f' only.
class PointwiseModule : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Tensor> savedTensors() const override { return input_.defined() ? std::vector<Tensor>{input_} : std::vector<Tensor>{}; }

 protected:
  virtual float value(float x) const = 0;
  virtual float derivative(float x) const = 0;
  // The GPU kernel of the same formula and its parameter (a slope or an alpha).
  virtual cuda::Activation gpuKind() const = 0;
  virtual float gpuParam() const { return 0.0f; }
  void clearCache() override { input_ = Tensor(); }

 private:
  Tensor input_;
};

class LeakyReLUModule : public PointwiseModule {
 public:
  explicit LeakyReLUModule(double negativeSlope = 0.01);
  std::string typeName() const override { return "LeakyReLUModule"; }
  ModuleSpec spec() const override { return {typeName(), {{"negative_slope", slope_}}}; }
  std::string repr() const override;
  double negativeSlope() const { return slope_; }

 protected:
  float value(float x) const override { return x > 0.0f ? x : x * static_cast<float>(slope_); }
  float derivative(float x) const override { return x > 0.0f ? 1.0f : static_cast<float>(slope_); }
  cuda::Activation gpuKind() const override { return cuda::Activation::LeakyReLU; }
  float gpuParam() const override { return static_cast<float>(slope_); }

 private:
  double slope_;
};

class ELUModule : public PointwiseModule {
 public:
  explicit ELUModule(double alpha = 1.0);
  std::string typeName() const override { return "ELUModule"; }
  ModuleSpec spec() const override { return {typeName(), {{"alpha", alpha_}}}; }
  std::string repr() const override;
  double alpha() const { return alpha_; }

 protected:
  float value(float x) const override;
  float derivative(float x) const override;
  cuda::Activation gpuKind() const override { return cuda::Activation::ELU; }
  float gpuParam() const override { return static_cast<float>(alpha_); }

 private:
  double alpha_;
};

class SwishModule : public PointwiseModule {
 public:
  std::string typeName() const override { return "SwishModule"; }

 protected:
  float value(float x) const override;
  float derivative(float x) const override;
  cuda::Activation gpuKind() const override { return cuda::Activation::Swish; }
};

class MishModule : public PointwiseModule {
 public:
  std::string typeName() const override { return "MishModule"; }

 protected:
  float value(float x) const override;
  float derivative(float x) const override;
  cuda::Activation gpuKind() const override { return cuda::Activation::Mish; }
};

}  // namespace cyxwiz::nn
