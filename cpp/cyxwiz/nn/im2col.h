// im2col / col2im: a convolution as one matrix product (the GEMM path of cyxwiz/tensor/blas.h).
//
// For an input (N, C, H, W) and a kernel of kh x kw taps, the column matrix has one row per (channel,
// tap) and one column per (sample, output position): rows c*kh*kw + i*kw + j, columns n*OH*OW + oh*OW + ow,
// holding x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside the image). The rows of channel group
// g are then one contiguous block, so a grouped convolution is one GEMM per group.
#pragma once

#include <cstdint>

namespace cyxwiz::nn {

struct ConvGeometry {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;

  int64_t outHeight() const { return (height + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t outWidth() const { return (width + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
  int64_t rows() const { return channels * kh * kw; }
  int64_t cols() const { return batch * outHeight() * outWidth(); }
};

// cols[rows() x cols()] from x[N, C, H, W].
void im2col(const ConvGeometry& g, const float* x, float* cols);
// dx[N, C, H, W] += the column gradient scattered back to where im2col read each value.
void col2imAdd(const ConvGeometry& g, const float* cols, float* dx);

}  // namespace cyxwiz::nn
