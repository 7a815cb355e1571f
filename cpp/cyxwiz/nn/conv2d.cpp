#include "cyxwiz/nn/conv2d.h"

#include <cmath>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

namespace {

std::string pairString(const Pair& p) { return makeString("(", p[0], ", ", p[1], ")"); }

}  // namespace

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
  auto& gen = globalGenerator();
  float* w = weight_.value.data<float>();
  for (int64_t i = 0; i < weight_.value.numel(); ++i) w[i] = (2.0f * uniform01(gen) - 1.0f) * bound;
  if (hasBias_) {
    float* b = bias_.value.data<float>();
    for (int64_t i = 0; i < out_; ++i) b[i] = (2.0f * uniform01(gen) - 1.0f) * bound;
  }
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

Tensor Conv2DModule::forward(const Tensor& input) {
  requireHostInput(input, repr() + ".forward", 4, "(N, C, H, W)");
  const Shape outShape = outputShape(input.shape());
  const ConvGeometry g = geometry(input.shape());
  const int64_t P = g.outHeight() * g.outWidth(), NP = g.cols();
  const int64_t Og = out_ / groups_, Kg = g.rows() / groups_;
  std::vector<float> cols(static_cast<size_t>(g.rows() * NP));
  im2col(g, input.data<float>(), cols.data());
  // y'[out, N*P]: one GEMM per group, over the whole batch at once.
  std::vector<float> y(static_cast<size_t>(out_ * NP));
  const float* w = weight_.value.data<float>();
  for (int64_t k = 0; k < groups_; ++k) {
    blas::sgemm(false, false, Og, NP, Kg, 1.0f, w + k * Og * Kg, Kg, cols.data() + k * Kg * NP, NP, 0.0f,
                y.data() + k * Og * NP, NP);
  }
  // (out, N, P) -> (N, out, P), adding the bias.
  Tensor output = Tensor::empty(outShape);
  float* o = output.data<float>();
  const float* b = hasBias_ ? bias_.value.data<float>() : nullptr;
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t c = 0; c < out_; ++c) {
      const float* src = y.data() + c * NP + n * P;
      float* dst = o + (n * out_ + c) * P;
      const float add = b ? b[c] : 0.0f;
      for (int64_t p = 0; p < P; ++p) dst[p] = src[p] + add;
    }
  }
  input_ = keepForBackward(input);
  return output;
}

Tensor Conv2DModule::backward(const Tensor& gradOutput) {
  requireForward(input_);
  checkBackward(input_, gradOutput, outputShape(input_.shape()));
  const ConvGeometry g = geometry(input_.shape());
  const int64_t P = g.outHeight() * g.outWidth(), NP = g.cols();
  const int64_t Og = out_ / groups_, Kg = g.rows() / groups_;
  // dy'[out, N*P] from dy (N, out, P); db = its row sums.
  std::vector<float> dy(static_cast<size_t>(out_ * NP));
  const float* go = gradOutput.data<float>();
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t c = 0; c < out_; ++c) {
      const float* src = go + (n * out_ + c) * P;
      std::copy(src, src + P, dy.data() + c * NP + n * P);
    }
  }
  if (hasBias_) {
    float* db = bias_.grad.data<float>();
    for (int64_t c = 0; c < out_; ++c) {
      double sum = 0.0;
      const float* row = dy.data() + c * NP;
      for (int64_t i = 0; i < NP; ++i) sum += row[i];
      db[c] += static_cast<float>(sum);
    }
  }
  std::vector<float> cols(static_cast<size_t>(g.rows() * NP));
  im2col(g, input_.data<float>(), cols.data());
  float* dw = weight_.grad.data<float>();
  // dW_g += dy'_g cols_g^T ; beta = 1 is the accumulation.
  for (int64_t k = 0; k < groups_; ++k) {
    blas::sgemm(false, true, Og, Kg, NP, 1.0f, dy.data() + k * Og * NP, NP, cols.data() + k * Kg * NP, NP, 1.0f,
                dw + k * Og * Kg, Kg);
  }
  gradsReady();
  if (!needInputGrad_) return Tensor();
  // dcols_g = W_g^T dy'_g, then scattered back onto the image.
  const float* w = weight_.value.data<float>();
  for (int64_t k = 0; k < groups_; ++k) {
    blas::sgemm(true, false, Kg, NP, Og, 1.0f, w + k * Og * Kg, Kg, dy.data() + k * Og * NP, NP, 0.0f,
                cols.data() + k * Kg * NP, NP);
  }
  Tensor gradInput = Tensor::zeros(input_.shape());
  col2imAdd(g, cols.data(), gradInput.data<float>());
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
