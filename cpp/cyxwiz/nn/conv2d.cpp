#include "cyxwiz/nn/conv2d.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops16.h"
#include "cyxwiz/nn/autocast.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/convert16.h"
#include "cyxwiz/tensor/dnnl.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

std::string pairString(const Pair& p) { return makeString("(", p[0], ", ", p[1], ")"); }

Conv2DModule::Conv2DModule(int64_t inChannels, int64_t outChannels, Pair kernel, Pair stride, Pair padding,
                           Pair dilation, int64_t groups, bool bias)
    : in_(inChannels), out_(outChannels), kernel_(kernel), stride_(stride), padding_(padding), dilation_(dilation),
      groups_(groups), hasBias_(bias) {
  const std::string who = makeString("Conv2DModule(", inChannels, ", ", outChannels, ", kernel_size=", pairString(kernel), ")");
  CYX_CHECK(inChannels > 0 && outChannels > 0, who, ": in_channels and out_channels must be positive");
  CYX_CHECK(kernel[0] > 0 && kernel[1] > 0, who, ": kernel_size must be positive");
  CYX_CHECK(stride[0] > 0 && stride[1] > 0, who, ": stride must be positive, got ", pairString(stride));
  CYX_CHECK(padding[0] >= 0 && padding[1] >= 0, who, ": padding must be 0 or more, got ", pairString(padding));
  CYX_CHECK(dilation[0] > 0 && dilation[1] > 0, who, ": dilation must be positive, got ", pairString(dilation));
  CYX_CHECK(groups > 0 && inChannels % groups == 0 && outChannels % groups == 0, who, ": groups=", groups,
            " must divide both in_channels and out_channels");
  weight_ = {"weight", Tensor::empty({out_, in_ / groups_, kernel_[0], kernel_[1]}),
             Tensor::zeros({out_, in_ / groups_, kernel_[0], kernel_[1]})};
  if (hasBias_) bias_ = {"bias", Tensor::empty({out_}), Tensor::zeros({out_})};
  resetParameters();
}

void Conv2DModule::resetParameters() {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_ / groups_ * kernel_[0] * kernel_[1]));
  fillUniform(weight_.value.data<float>(), weight_.value.numel(), bound, globalGenerator());
  if (hasBias_) fillUniform(bias_.value.data<float>(), out_, bound, globalGenerator());
}

ConvGeometry Conv2DModule::geometry(const Shape& input) const {
  ConvGeometry g;
  g.batch = input[0];
  g.channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.kh = kernel_[0], g.kw = kernel_[1];
  g.sh = stride_[0], g.sw = stride_[1];
  g.ph = padding_[0], g.pw = padding_[1];
  g.dh = dilation_[0], g.dw = dilation_[1];
  return g;
}

Shape Conv2DModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, out_, -1, -1};
  if (input.size() != 4) {
    throw InvalidArgument(makeString(repr(), " expects input (N, ", in_, ", H, W), got ", describeShape(input),
                                     input.size() == 2 ? "; reshape rows of pixels to (N, C, H, W) first" : ""));
  }
  if (input[1] >= 0 && input[1] != in_) {
    throw InvalidArgument(makeString(repr(), " expects ", in_, " input channel", in_ == 1 ? "" : "s", ", got ", input[1],
                                     " in input ", describeShape(input)));
  }
  Shape out{input[0], out_, -1, -1};
  for (int axis = 0; axis < 2; ++axis) {
    const int64_t size = input[2 + axis];
    if (size < 0) continue;
    const int64_t span = dilation_[axis] * (kernel_[axis] - 1) + 1;
    if (size + 2 * padding_[axis] < span) {
      throw InvalidArgument(makeString(repr(), ": the input ", describeShape(input), " is smaller than the kernel (",
                                       axis ? "width " : "height ", size, " + 2 x padding ", padding_[axis], " < ", span, ")"));
    }
    out[2 + axis] = (size + 2 * padding_[axis] - span) / stride_[axis] + 1;
  }
  return out;
}

namespace {

// Samples per im2col chunk: enough output positions for an efficient GEMM (a chunk of several small
// images is one product), few enough that the column matrix stays in the cache (<= 2 MiB) while the
// GEMM reads it. One sample per chunk writes the GEMM's result straight into the output.
int64_t chunkSamples(const ConvGeometry& g) {
  const int64_t P = g.outHeight() * g.outWidth();
  int64_t nb = std::max<int64_t>(1, (512 + P - 1) / P);
  const int64_t perSample = std::max<int64_t>(1, g.rows() * P * static_cast<int64_t>(sizeof(float)));
  nb = std::min(nb, std::max<int64_t>(1, (int64_t(2) << 20) / perSample));
  return std::min(nb, g.batch);
}

// The chunk of `count` samples starting at `first`, as a geometry of its own.
ConvGeometry chunkOf(ConvGeometry g, int64_t count) {
  g.batch = count;
  return g;
}

// `t` rounded to the 16-bit type and held as float32: under autocast the convolution multiplies 16-bit
// operands and accumulates in float32, on whichever kernel runs.
Tensor rounded(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape());
  roundFloats(t.data<float>(), out.data<float>(), t.numel(), dtype);
  return out;
}

// The 16-bit tensor `t` as float32 (exact).
Tensor widened(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape());
  widenFloats(static_cast<const uint16_t*>(t.rawData()), out.data<float>(), t.numel(), t.dtype());
  return out;
}

}  // namespace

dnnl::ConvShape Conv2DModule::kernelShape(const Shape& input) const {
  const ConvGeometry g = geometry(input);
  return {g.batch, g.channels, g.height, g.width, out_, g.outHeight(), g.outWidth(), g.kh, g.kw, g.sh, g.sw,
          g.ph, g.pw, g.dh, g.dw, groups_, hasBias_};
}

Tensor Conv2DModule::forward(const Tensor& input) {
  requireInput(input, repr() + ".forward", 4, "(N, C, H, W)");
  const Shape outShape = outputShape(input.shape());
  if (weight_.value.isCuda()) return forwardGpu(input, outShape);
  const Tensor host = input.to(Device{});  // a GPU input of a CPU layer: copied once, here at the edge
  const ConvGeometry g = geometry(host.shape());
  const int64_t P = g.outHeight() * g.outWidth(), inSample = g.channels * g.height * g.width;
  const int64_t Og = out_ / groups_, Kg = g.rows() / groups_;
  Tensor output = Tensor::empty(outShape);
  float* o = output.data<float>();
  input_ = Tensor();
  half_ = autocastDtype();
  const float* b = hasBias_ ? bias_.value.data<float>() : nullptr;
  if (half_ == DType::BFloat16 && dnnl::available()) {
    // oneDNN's bfloat16 kernels: the 16-bit input is what backward keeps (half the bytes); the weight
    // is rounded by the reorder into the kernel's layout.
    Tensor x16 = narrowActivation(host, DType::BFloat16);
    dnnl::ConvShape shape = kernelShape(host.shape());
    shape.bf16 = true;
    if (dnnl::convForward(shape, x16.rawData(), weight_.value.data<float>(), b, o)) {
      input_ = x16;
      return output;
    }
  }
  const Tensor xin = half_ ? rounded(host, *half_) : keepForBackward(host);
  const Tensor weight = half_ ? rounded(weight_.value, *half_) : weight_.value;
  const float* x = xin.data<float>();
  const float* w = weight.data<float>();
  if (dnnl::available() && dnnl::convForward(kernelShape(host.shape()), x, w, b, o)) {
    input_ = xin;
    return output;
  }
  const int64_t nb = chunkSamples(g);
  std::vector<float> cols(static_cast<size_t>(g.rows() * nb * P));
  std::vector<float> y(nb > 1 ? static_cast<size_t>(out_ * nb * P) : 0);
  for (int64_t n0 = 0; n0 < g.batch; n0 += nb) {
    const int64_t count = std::min(nb, g.batch - n0), NP = count * P;
    im2col(chunkOf(g, count), x + n0 * inSample, cols.data());
    // y'[out, count*P] = W cols, one GEMM per group; with one sample y' is the output itself.
    float* dst = count == 1 ? o + n0 * out_ * P : y.data();
    for (int64_t k = 0; k < groups_; ++k) {
      blas::sgemm(false, false, Og, NP, Kg, 1.0f, w + k * Og * Kg, Kg, cols.data() + k * Kg * NP, NP, 0.0f,
                  dst + k * Og * NP, NP);
    }
    // (out, count, P) -> (count, out, P), adding the bias.
    for (int64_t n = 0; n < count; ++n) {
      for (int64_t c = 0; c < out_; ++c) {
        float* row = o + ((n0 + n) * out_ + c) * P;
        const float add = b ? b[c] : 0.0f;
        if (count == 1) {
          if (b) for (int64_t p = 0; p < P; ++p) row[p] += add;
          continue;
        }
        const float* src = y.data() + c * NP + n * P;
        for (int64_t p = 0; p < P; ++p) row[p] = src[p] + add;
      }
    }
  }
  input_ = xin;
  return output;
}

Tensor Conv2DModule::backward(const Tensor& gradOutput) {
  requireForward(input_);
  checkBackward(input_, gradOutput, outputShape(input_.shape()));
  if (input_.isCuda()) return backwardGpu(gradOutput);
  if (input_.dtype() == DType::BFloat16) {  // oneDNN's bfloat16 forward: its backward kernels too
    dnnl::ConvShape shape = kernelShape(input_.shape());
    shape.bf16 = true;
    if (dnnl::convBackwardWeights(shape, input_.rawData(), gradOutput.data<float>(), weight_.grad.data<float>(),
                                  hasBias_ ? bias_.grad.data<float>() : nullptr)) {
      gradsReady();
      if (!needInputGrad_) return Tensor();
      Tensor gradInput = Tensor::empty(input_.shape());
      if (dnnl::convBackwardData(shape, gradOutput.data<float>(), weight_.value.data<float>(), gradInput.data<float>())) {
        return gradInput;
      }
      input_ = widened(input_);
      return inputGradIm2col(rounded(gradOutput, DType::BFloat16), rounded(weight_.value, DType::BFloat16));
    }
    input_ = widened(input_);  // exactly the rounded values the float32 kernels then take
  }
  // Under autocast (the forward's): the gradient and the weight rounded as the input was.
  const Tensor g = half_ ? rounded(gradOutput, *half_) : gradOutput;
  const dnnl::ConvShape shape = kernelShape(input_.shape());
  const bool oneDnn = dnnl::available() &&
                      dnnl::convBackwardWeights(shape, input_.data<float>(), g.data<float>(),
                                                weight_.grad.data<float>(), hasBias_ ? bias_.grad.data<float>() : nullptr);
  if (!oneDnn) weightGradsIm2col(g);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  const Tensor weight = half_ ? rounded(weight_.value, *half_) : weight_.value;
  if (oneDnn) {
    Tensor gradInput = Tensor::empty(input_.shape());
    if (dnnl::convBackwardData(shape, g.data<float>(), weight.data<float>(), gradInput.data<float>())) return gradInput;
  }
  return inputGradIm2col(g, weight);
}

namespace {

cuda::ConvShape cudaShape(const dnnl::ConvShape& s) {
  return {s.batch, s.channels, s.height, s.width, s.outChannels, s.outHeight, s.outWidth, s.kh, s.kw, s.sh, s.sw,
          s.ph, s.pw, s.dh, s.dw, s.groups};
}

// `t` (float32 on a GPU) rounded to the 16-bit type and widened back: autocast's operands for the
// float32 cuDNN kernels (16-bit products, float32 accumulation), as the CPU's fallback rounds them.
Tensor roundedOnDevice(const Tensor& t, DType dtype) {
  const Tensor t16 = ops::narrowOnDevice(t, dtype);
  Tensor out = Tensor::empty(t.shape(), DType::Float32, t.device());
  CYX_CUDA(convertFloats(t.device().index, t16.rawData(), static_cast<cuda::ElemType>(dtype), out.deviceData<float>(),
                         cuda::ElemType::Float32, t.numel(), 1.0f));
  return out;
}

}  // namespace

Tensor Conv2DModule::forwardGpu(const Tensor& input, const Shape& outShape) {
  const Device device = weight_.value.device();
  input_ = Tensor();
  half_ = autocastDtype();
  const Tensor x = half_ ? roundedOnDevice(input.to(device), *half_) : keepForBackward(input.to(device));
  const Tensor weight = half_ ? roundedOnDevice(weight_.value, *half_) : weight_.value;
  Tensor output = Tensor::empty(outShape, DType::Float32, device);
  CYX_CUDA(convForward(device.index, cudaShape(kernelShape(x.shape())), x.deviceData<float>(), weight.deviceData<float>(),
                       hasBias_ ? bias_.value.deviceData<float>() : nullptr, output.deviceData<float>()));
  input_ = x;
  return output;
}

Tensor Conv2DModule::backwardGpu(const Tensor& gradOutput) {
  const Device device = input_.device();
  const Tensor moved = gradOutput.to(device);
  const Tensor g = half_ ? roundedOnDevice(moved, *half_) : moved;
  const cuda::ConvShape shape = cudaShape(kernelShape(input_.shape()));
  CYX_CUDA(convBackwardFilter(device.index, shape, input_.deviceData<float>(), g.deviceData<float>(),
                              weight_.grad.deviceData<float>(), hasBias_ ? bias_.grad.deviceData<float>() : nullptr));
  gradsReady();
  if (!needInputGrad_) return Tensor();
  const Tensor weight = half_ ? roundedOnDevice(weight_.value, *half_) : weight_.value;
  Tensor gradInput = Tensor::empty(input_.shape(), DType::Float32, device);
  CYX_CUDA(convBackwardData(device.index, shape, g.deviceData<float>(), weight.deviceData<float>(),
                            gradInput.deviceData<float>()));
  return gradInput;
}

// dy'[out, count*P] of the chunk of `count` samples from `first`: the gradient itself for one sample,
// else gathered from (count, out, P) into `buffer`.
const float* Conv2DModule::chunkGradient(const float* go, int64_t first, int64_t count, int64_t P,
                                         std::vector<float>& buffer) const {
  if (count == 1) return go + first * out_ * P;
  buffer.resize(static_cast<size_t>(out_ * count * P));
  for (int64_t n = 0; n < count; ++n) {
    for (int64_t c = 0; c < out_; ++c) {
      const float* src = go + ((first + n) * out_ + c) * P;
      std::copy(src, src + P, buffer.data() + c * count * P + n * P);
    }
  }
  return buffer.data();
}

void Conv2DModule::weightGradsIm2col(const Tensor& gradOutput) {
  const ConvGeometry g = geometry(input_.shape());
  const int64_t P = g.outHeight() * g.outWidth(), inSample = g.channels * g.height * g.width;
  const int64_t Og = out_ / groups_, Kg = g.rows() / groups_;
  const int64_t nb = chunkSamples(g);
  const float* go = gradOutput.data<float>();
  if (hasBias_) {
    float* db = bias_.grad.data<float>();
    for (int64_t c = 0; c < out_; ++c) {
      double sum = 0.0;
      for (int64_t n = 0; n < g.batch; ++n) {
        const float* row = go + (n * out_ + c) * P;
        for (int64_t p = 0; p < P; ++p) sum += row[p];
      }
      db[c] += static_cast<float>(sum);
    }
  }
  // dW_g += dy'_g cols_g^T, chunk by chunk (beta = 1 is the accumulation).
  std::vector<float> cols(static_cast<size_t>(g.rows() * nb * P)), gathered;
  float* dw = weight_.grad.data<float>();
  const float* x = input_.data<float>();
  for (int64_t n0 = 0; n0 < g.batch; n0 += nb) {
    const int64_t count = std::min(nb, g.batch - n0), NP = count * P;
    const float* dy = chunkGradient(go, n0, count, P, gathered);
    im2col(chunkOf(g, count), x + n0 * inSample, cols.data());
    for (int64_t k = 0; k < groups_; ++k) {
      blas::sgemm(false, true, Og, Kg, NP, 1.0f, dy + k * Og * NP, NP, cols.data() + k * Kg * NP, NP, 1.0f,
                  dw + k * Og * Kg, Kg);
    }
  }
}

Tensor Conv2DModule::inputGradIm2col(const Tensor& gradOutput, const Tensor& weight) {
  const ConvGeometry g = geometry(input_.shape());
  const int64_t P = g.outHeight() * g.outWidth(), inSample = g.channels * g.height * g.width;
  const int64_t Og = out_ / groups_, Kg = g.rows() / groups_;
  const int64_t nb = chunkSamples(g);
  const float* go = gradOutput.data<float>();
  // dcols_g = W_g^T dy'_g, scattered back onto the image.
  std::vector<float> cols(static_cast<size_t>(g.rows() * nb * P)), gathered;
  const float* w = weight.data<float>();
  Tensor gradInput = Tensor::zeros(input_.shape());
  float* dx = gradInput.data<float>();
  for (int64_t n0 = 0; n0 < g.batch; n0 += nb) {
    const int64_t count = std::min(nb, g.batch - n0), NP = count * P;
    const float* dy = chunkGradient(go, n0, count, P, gathered);
    for (int64_t k = 0; k < groups_; ++k) {
      blas::sgemm(true, false, Kg, NP, Og, 1.0f, w + k * Og * Kg, Kg, dy + k * Og * NP, NP, 0.0f,
                  cols.data() + k * Kg * NP, NP);
    }
    col2imAdd(chunkOf(g, count), cols.data(), dx + n0 * inSample);
  }
  return gradInput;
}

std::vector<Parameter*> Conv2DModule::parameters() {
  if (hasBias_) return {&weight_, &bias_};
  return {&weight_};
}

ModuleSpec Conv2DModule::spec() const {
  return {typeName(),
          {{"in_channels", double(in_)}, {"out_channels", double(out_)}, {"kernel_h", double(kernel_[0])},
           {"kernel_w", double(kernel_[1])}, {"stride_h", double(stride_[0])}, {"stride_w", double(stride_[1])},
           {"padding_h", double(padding_[0])}, {"padding_w", double(padding_[1])},
           {"dilation_h", double(dilation_[0])}, {"dilation_w", double(dilation_[1])}, {"groups", double(groups_)},
           {"bias", hasBias_ ? 1.0 : 0.0}}};
}

std::string Conv2DModule::repr() const {
  std::string out = makeString("Conv2DModule(", in_, ", ", out_, ", kernel_size=", pairString(kernel_), ", stride=",
                               pairString(stride_));
  if (padding_ != Pair{0, 0}) out += ", padding=" + pairString(padding_);
  if (dilation_ != Pair{1, 1}) out += ", dilation=" + pairString(dilation_);
  if (groups_ != 1) out += makeString(", groups=", groups_);
  if (!hasBias_) out += ", use_bias=False";
  return out + ")";
}

}  // namespace cyxwiz::nn
