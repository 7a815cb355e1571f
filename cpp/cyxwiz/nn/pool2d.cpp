#include "cyxwiz/nn/pool2d.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include <limits>

#include "cyxwiz/common/error.h"
#include "cyxwiz/common/parallel.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::nn {

namespace {

// Throws unless a gradient of `expected` shape came back after a forward.
void checkPoolBackward(const Module& m, const Shape& inputShape, const Shape& expected, const Tensor& g) {
  if (inputShape.empty()) {
    throw InvalidArgument(m.typeName() + ".backward called before forward; run forward on the batch first");
  }
  if (g.dtype() != DType::Float32 || g.shape() != expected) {
    throw InvalidArgument(makeString(m.typeName(), ".backward: expected a float32 gradient of shape ", shapeString(expected),
                                     " (the shape forward returned), got ", dtypeName(g.dtype()), " ", shapeString(g.shape())));
  }
}

// The gradient on the device of the forward's input (a host gradient of a GPU layer is copied once).
Tensor onDeviceOf(const Tensor& g, const Tensor& input) { return g.to(input.device()); }

}  // namespace

Pool2DModule::Pool2DModule(bool max, Pair pool, Pair stride, Pair padding)
    : max_(max), pool_(pool), stride_(stride[0] == 0 && stride[1] == 0 ? pool : stride), padding_(padding) {
  const std::string who = makeString(typeName(), "(", pairString(pool), ")");
  CYX_CHECK(pool[0] > 0 && pool[1] > 0, who, ": pool_size must be positive");
  CYX_CHECK(stride_[0] > 0 && stride_[1] > 0, who, ": stride must be positive, got ", pairString(stride_));
  // torch's rule: the padding at most half the window, so that every window sees the image.
  CYX_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= pool[0] && 2 * padding[1] <= pool[1], who,
            ": padding ", pairString(padding), " must be between 0 and half the pool size");
}

Shape Pool2DModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, -1, -1, -1};
  if (input.size() != 4) throw InvalidArgument(makeString(repr(), " expects input (N, C, H, W), got ", describeShape(input)));
  Shape out{input[0], input[1], -1, -1};
  for (int axis = 0; axis < 2; ++axis) {
    const int64_t size = input[2 + axis];
    if (size < 0) continue;
    if (size + 2 * padding_[axis] < pool_[axis]) {
      throw InvalidArgument(makeString(repr(), ": the input ", describeShape(input), " is smaller than the pool window"));
    }
    out[2 + axis] = (size + 2 * padding_[axis] - pool_[axis]) / stride_[axis] + 1;
  }
  return out;
}

namespace {

// The input rows (or columns) [begin, end) each output row (column) pools over, clipped to the image.
struct Windows {
  std::vector<int64_t> begin, end;
  Windows(int64_t outSize, int64_t stride, int64_t pad, int64_t pool, int64_t size) {
    for (int64_t o = 0; o < outSize; ++o) {
      const int64_t first = o * stride - pad;
      begin.push_back(std::max<int64_t>(first, 0));
      end.push_back(std::min(first + pool, size));
    }
  }
};

}  // namespace

cuda::PoolShape Pool2DModule::cudaShape(const Shape& in) const {
  const Shape out = outputShape(in);
  return {in[0], in[1], in[2], in[3], out[2], out[3], pool_[0], pool_[1], stride_[0], stride_[1], padding_[0], padding_[1],
          max_ ? cuda::PoolKind::Max : cuda::PoolKind::AvgIncludePad};
}

Tensor Pool2DModule::forward(const Tensor& input) {
  requireInput(input, repr() + ".forward", 4, "(N, C, H, W)");
  const Shape outShape = outputShape(input.shape());
  if (input.isCuda()) {
    Tensor output = Tensor::empty(outShape, DType::Float32, input.device());
    CYX_CUDA(poolForward(input.device().index, cudaShape(input.shape()), input.deviceData<float>(), output.deviceData<float>()));
    gpuInput_ = keepForBackward(input);
    gpuOutput_ = output;
    inputShape_ = input.shape();
    return output;
  }
  gpuInput_ = gpuOutput_ = Tensor();
  const int64_t H = input.size(2), W = input.size(3), OH = outShape[2], OW = outShape[3];
  const int64_t planes = input.size(0) * input.size(1);
  CYX_CHECK(H * W <= std::numeric_limits<int32_t>::max(), repr(), ": an image plane of ", H, " x ", W, " is too large");
  const Windows rows(OH, stride_[0], padding_[0], pool_[0], H), cols(OW, stride_[1], padding_[1], pool_[1], W);
  Tensor output = Tensor::empty(outShape);
  const float* x = input.data<float>();
  float* y = output.data<float>();
  if (max_) argmax_.resize(static_cast<size_t>(planes * OH * OW));
  const float inverse = 1.0f / static_cast<float>(pool_[0] * pool_[1]);  // count_include_pad
  // Output columns whose window lies inside the image: max pooling runs them as a vector loop over
  // the columns (a window's elements one after the other, so ties still go to the first).
  int64_t inFirst = OW, inLast = OW;
  for (int64_t ow = 0; ow < OW; ++ow) {
    const bool inside = ow * stride_[1] - padding_[1] >= 0 && ow * stride_[1] - padding_[1] + pool_[1] <= W;
    if (inside && inFirst == OW) inFirst = ow;
    if (inside) inLast = ow + 1;
  }
  parallelFor(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(H * W, 1)), [&](int64_t first, int64_t last) {
  std::vector<float> best(static_cast<size_t>(OW));
  std::vector<int32_t> where(static_cast<size_t>(OW));
  for (int64_t p = first; p < last; ++p) {
    const float* plane = x + p * H * W;
    float* out = y + p * OH * OW;
    int32_t* arg = max_ ? argmax_.data() + p * OH * OW : nullptr;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const int64_t h0 = rows.begin[oh], h1 = rows.end[oh];
      if (max_ && inFirst < inLast) {
        const int64_t sw = stride_[1];
        for (int64_t ow = inFirst; ow < inLast; ++ow) {
          best[ow] = -std::numeric_limits<float>::infinity();
          where[ow] = static_cast<int32_t>(h0 * W + ow * sw - padding_[1]);
        }
        for (int64_t h = h0; h < h1; ++h) {
          for (int64_t j = 0; j < pool_[1]; ++j) {
            const int64_t offset = h * W - padding_[1] + j;
            const float* src = plane + offset;
            float* b = best.data();
            int32_t* wh = where.data();
            for (int64_t ow = inFirst; ow < inLast; ++ow) {
              const float v = src[ow * sw];
              const bool take = (v > b[ow]) | (v != v);  // torch's rule: a larger value or a NaN
              b[ow] = take ? v : b[ow];
              wh[ow] = take ? static_cast<int32_t>(offset + ow * sw) : wh[ow];
            }
          }
        }
        for (int64_t ow = inFirst; ow < inLast; ++ow) {
          out[oh * OW + ow] = best[ow];
          arg[oh * OW + ow] = where[ow];
        }
      }
      for (int64_t ow = 0; ow < OW; ++ow) {
        if (max_ && ow >= inFirst && ow < inLast) continue;
        const int64_t w0 = cols.begin[ow], w1 = cols.end[ow];
        if (max_) {
          int64_t at = h0 * W + w0;
          float value = -std::numeric_limits<float>::infinity();
          for (int64_t h = h0; h < h1; ++h) {
            for (int64_t w = w0; w < w1; ++w) {
              const float v = plane[h * W + w];
              if (v > value || v != v) {
                value = v;
                at = h * W + w;
              }
            }
          }
          out[oh * OW + ow] = value;
          arg[oh * OW + ow] = static_cast<int32_t>(at);
        } else {
          float sum = 0.0f;
          for (int64_t h = h0; h < h1; ++h) {
            for (int64_t w = w0; w < w1; ++w) sum += plane[h * W + w];
          }
          out[oh * OW + ow] = sum * inverse;
        }
      }
    }
  }
  });
  inputShape_ = input.shape();
  return output;
}

Tensor Pool2DModule::backward(const Tensor& gradOutput) {
  checkPoolBackward(*this, inputShape_, inputShape_.empty() ? Shape{} : outputShape(inputShape_), gradOutput);
  if (!needInputGrad_) return Tensor();
  if (gpuInput_.defined()) {
    const Tensor g = onDeviceOf(gradOutput, gpuInput_);
    Tensor gradInput = Tensor::empty(inputShape_, DType::Float32, g.device());
    CYX_CUDA(poolBackward(g.device().index, cudaShape(inputShape_), gpuInput_.deviceData<float>(),
                          gpuOutput_.deviceData<float>(), g.deviceData<float>(), gradInput.deviceData<float>()));
    return gradInput;
  }
  const Tensor host = gradOutput.to(Device{});
  const int64_t H = inputShape_[2], W = inputShape_[3], OH = gradOutput.size(2), OW = gradOutput.size(3);
  const int64_t planes = inputShape_[0] * inputShape_[1];
  Tensor gradInput = Tensor::zeros(inputShape_);
  float* dx = gradInput.data<float>();
  const float* g = host.data<float>();
  const float divisor = static_cast<float>(pool_[0] * pool_[1]);
  parallelFor(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(H * W, 1)), [&](int64_t first, int64_t last) {
  for (int64_t p = first; p < last; ++p) {
    float* plane = dx + p * H * W;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const int64_t h0 = oh * stride_[0] - padding_[0];
      const int64_t hBegin = std::max<int64_t>(h0, 0), hEnd = std::min(h0 + pool_[0], H);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t o = (p * OH + oh) * OW + ow;
        if (max_) {
          plane[argmax_[static_cast<size_t>(o)]] += g[o];
          continue;
        }
        const int64_t w0 = ow * stride_[1] - padding_[1];
        const int64_t wBegin = std::max<int64_t>(w0, 0), wEnd = std::min(w0 + pool_[1], W);
        const float share = g[o] / divisor;
        for (int64_t h = hBegin; h < hEnd; ++h) {
          for (int64_t w = wBegin; w < wEnd; ++w) plane[h * W + w] += share;
        }
      }
    }
  }
  });
  return gradInput;
}

ModuleSpec Pool2DModule::spec() const {
  return {typeName(),
          {{"pool_h", double(pool_[0])}, {"pool_w", double(pool_[1])}, {"stride_h", double(stride_[0])},
           {"stride_w", double(stride_[1])}, {"padding_h", double(padding_[0])}, {"padding_w", double(padding_[1])}}};
}

std::string Pool2DModule::repr() const {
  std::string out = makeString(typeName(), "(pool_size=", pairString(pool_), ", stride=", pairString(stride_));
  if (padding_ != Pair{0, 0}) out += ", padding=" + pairString(padding_);
  return out + ")";
}

Shape GlobalAvgPool2DModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, -1};
  if (input.size() != 4) throw InvalidArgument(makeString(repr(), " expects input (N, C, H, W), got ", describeShape(input)));
  return {input[0], input[1]};
}

Tensor GlobalAvgPool2DModule::forward(const Tensor& input) {
  requireInput(input, repr() + ".forward", 4, "(N, C, H, W)");
  if (input.isCuda()) {
    // One average-pooling window the size of the image.
    const int64_t H = input.size(2), W = input.size(3);
    const cuda::PoolShape shape{input.size(0), input.size(1), H, W, 1, 1, H, W, H, W, 0, 0, cuda::PoolKind::AvgIncludePad};
    Tensor output = Tensor::empty({input.size(0), input.size(1), 1, 1}, DType::Float32, input.device());
    CYX_CUDA(poolForward(input.device().index, shape, input.deviceData<float>(), output.deviceData<float>()));
    gpuInput_ = keepForBackward(input);
    gpuOutput_ = output;
    inputShape_ = input.shape();
    return output.reshape({input.size(0), input.size(1)});
  }
  gpuInput_ = gpuOutput_ = Tensor();
  const int64_t planes = input.size(0) * input.size(1), P = input.size(2) * input.size(3);
  Tensor output = Tensor::empty({input.size(0), input.size(1)});
  const float* x = input.data<float>();
  float* y = output.data<float>();
  for (int64_t p = 0; p < planes; ++p) {
    float sum = 0.0f;
    for (int64_t i = 0; i < P; ++i) sum += x[p * P + i];
    y[p] = sum / static_cast<float>(P);
  }
  inputShape_ = input.shape();
  return output;
}

Tensor GlobalAvgPool2DModule::backward(const Tensor& gradOutput) {
  checkPoolBackward(*this, inputShape_, inputShape_.empty() ? Shape{} : outputShape(inputShape_), gradOutput);
  if (!needInputGrad_) return Tensor();
  const int64_t planes = inputShape_[0] * inputShape_[1], P = inputShape_[2] * inputShape_[3];
  if (gpuInput_.defined()) {
    const Tensor g = onDeviceOf(gradOutput, gpuInput_);
    const int64_t H = inputShape_[2], W = inputShape_[3];
    const cuda::PoolShape shape{inputShape_[0], inputShape_[1], H, W, 1, 1, H, W, H, W, 0, 0, cuda::PoolKind::AvgIncludePad};
    Tensor gradInput = Tensor::empty(inputShape_, DType::Float32, g.device());
    CYX_CUDA(poolBackward(g.device().index, shape, gpuInput_.deviceData<float>(), gpuOutput_.deviceData<float>(),
                          g.deviceData<float>(), gradInput.deviceData<float>()));
    return gradInput;
  }
  Tensor gradInput = Tensor::empty(inputShape_);
  const Tensor host = gradOutput.to(Device{});
  const float* g = host.data<float>();
  float* dx = gradInput.data<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float share = g[p] / static_cast<float>(P);
    for (int64_t i = 0; i < P; ++i) dx[p * P + i] = share;
  }
  return gradInput;
}

Shape FlattenModule::outputShape(const Shape& input) const {
  if (input.empty()) return {-1, -1};
  if (input.size() < 2) throw InvalidArgument(makeString(repr(), " expects input (N, ...), got ", describeShape(input)));
  int64_t features = 1;
  for (size_t i = 1; i < input.size(); ++i) features = input[i] < 0 || features < 0 ? -1 : features * input[i];
  return {input[0], features};
}

Tensor FlattenModule::forward(const Tensor& input) {
  if (input.dtype() != DType::Float32) throw TypeMismatch(makeString(repr(), ".forward: expected float32 input, got ", dtypeName(input.dtype())));
  const Shape out = outputShape(input.shape());
  inputShape_ = input.shape();
  return input.reshape(out);  // a view: no copy (the next layer copies the caller's array if it keeps it)
}

Tensor FlattenModule::backward(const Tensor& gradOutput) {
  if (inputShape_.empty()) throw InvalidArgument(repr() + ".backward called before forward; run forward on the batch first");
  const Shape expected = outputShape(inputShape_);
  if (gradOutput.dtype() != DType::Float32 || gradOutput.shape() != expected) {
    throw InvalidArgument(makeString(repr(), ".backward: expected a float32 gradient of shape ", shapeString(expected),
                                     ", got ", dtypeName(gradOutput.dtype()), " ", shapeString(gradOutput.shape())));
  }
  if (!needInputGrad_) return Tensor();
  return gradOutput.reshape(inputShape_);
}

}  // namespace cyxwiz::nn
