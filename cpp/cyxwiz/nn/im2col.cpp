#include "cyxwiz/nn/im2col.h"

#include <algorithm>
#include <cstring>

namespace cyxwiz::nn {

namespace {

// The output columns [first, last) whose input index o*stride - pad + offset lies in [0, size): the
// rest read padding. Keeps the inner loops free of bounds checks.
void validRange(int64_t outSize, int64_t stride, int64_t start, int64_t size, int64_t& first, int64_t& last) {
  // o*stride + start >= 0  and  o*stride + start < size
  first = start >= 0 ? 0 : (-start + stride - 1) / stride;
  last = size - start <= 0 ? 0 : (size - start + stride - 1) / stride;
  first = std::min(first, outSize);
  last = std::clamp(last, first, outSize);
}

// Calls f(row, n, oh, ih, owFirst, owLast, iwStart) for every row of the column matrix and every
// sample and output row whose input row is inside the image: the shared walk of im2col and col2im.
template <typename F>
void forEachRun(const ConvGeometry& g, F f) {
  const int64_t OH = g.outHeight(), OW = g.outWidth();
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t row = (c * g.kh + i) * g.kw + j;
        const int64_t hStart = i * g.dh - g.ph, wStart = j * g.dw - g.pw;
        int64_t ohFirst, ohLast, owFirst, owLast;
        validRange(OH, g.sh, hStart, g.height, ohFirst, ohLast);
        validRange(OW, g.sw, wStart, g.width, owFirst, owLast);
        for (int64_t n = 0; n < g.batch; ++n) {
          for (int64_t oh = ohFirst; oh < ohLast; ++oh) {
            f(row, n, c, oh, oh * g.sh + hStart, owFirst, owLast, wStart);
          }
        }
      }
    }
  }
}

}  // namespace

void im2col(const ConvGeometry& g, const float* x, float* cols) {
  const int64_t OH = g.outHeight(), OW = g.outWidth(), P = OH * OW;
  // Without padding every entry is written below; with it, the positions outside the image stay 0.
  if (g.ph > 0 || g.pw > 0) std::memset(cols, 0, static_cast<size_t>(g.rows() * g.cols()) * sizeof(float));
  forEachRun(g, [&](int64_t row, int64_t n, int64_t c, int64_t oh, int64_t ih, int64_t owFirst, int64_t owLast,
                    int64_t wStart) {
    const float* in = x + ((n * g.channels + c) * g.height + ih) * g.width + wStart;
    float* out = cols + row * g.cols() + n * P + oh * OW;
    if (g.sw == 1) {
      std::memcpy(out + owFirst, in + owFirst, static_cast<size_t>(owLast - owFirst) * sizeof(float));
    } else {
      for (int64_t ow = owFirst; ow < owLast; ++ow) out[ow] = in[ow * g.sw];
    }
  });
}

void col2imAdd(const ConvGeometry& g, const float* cols, float* dx) {
  const int64_t OH = g.outHeight(), OW = g.outWidth(), P = OH * OW;
  forEachRun(g, [&](int64_t row, int64_t n, int64_t c, int64_t oh, int64_t ih, int64_t owFirst, int64_t owLast,
                    int64_t wStart) {
    float* out = dx + ((n * g.channels + c) * g.height + ih) * g.width + wStart;
    const float* in = cols + row * g.cols() + n * P + oh * OW;
    for (int64_t ow = owFirst; ow < owLast; ++ow) out[ow * g.sw] += in[ow];
  });
}

}  // namespace cyxwiz::nn
