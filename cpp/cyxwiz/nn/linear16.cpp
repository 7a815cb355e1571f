#include "cyxwiz/nn/linear16.h"

#include <algorithm>

#include "cyxwiz/device/ops.h"
#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/blas16.h"
#include "cyxwiz/tensor/convert16.h"
#include "cyxwiz/tensor/host_cache.h"

namespace cyxwiz::nn {

namespace {

// 4 MiB of float32 per rounded or widened block. Larger blocks mean fewer GEMM calls (each wakes the
// BLAS threads: on a busy machine that costs more than the call) but more memory held at the peak;
// 16 MiB blocks made the 784-4096-4096-10 step at batch 1024 faster here and its peak higher than
// float32's (benchmarks/results/mixed_precision_2core.md).
constexpr int64_t kBlockFloats = int64_t{1} << 20;

// Rows of a (rows, cols) matrix per block.
int64_t blockRows(int64_t cols) { return std::max<int64_t>(1, kBlockFloats / std::max<int64_t>(cols, 1)); }

// A buffer of `floats` uninitialised floats (every element is written before it is read): one per
// call, reused by all of its blocks and given back after it (to the host cache: the next step's call
// of the same shape takes it again instead of faulting in new pages).
using Floats = host_cache::Scratch<float>;
using Bits16 = host_cache::Scratch<uint16_t>;
Floats buffer(int64_t floats) { return Floats(floats); }

const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.rawData()); }

// bfloat16 products straight from the 16-bit operands (tensor/blas16.h), when oneMKL is there.
bool direct(DType dtype) { return dtype == DType::BFloat16 && blas16::available(); }

Bits16 buffer16(int64_t n) { return Bits16(n); }

// n floats rounded into a new bfloat16 buffer (exact when they already hold bfloat16 values).
Bits16 narrowed(const float* x, int64_t n) {
  Bits16 out = buffer16(n);
  narrowFloats(x, out.get(), n, DType::BFloat16);
  return out;
}

}  // namespace

void linearForward16(const Tensor& x16, const float* w, const float* bias, float* y, int64_t out, bool relu) {
  const int64_t rows = x16.size(0), in = x16.size(1);
  const DType dtype = x16.dtype();
  // Seed each row with the bias; each block's GEMM accumulates onto it (beta = 1).
  if (bias) ops::broadcastRows(Device{}, bias, y, rows, out);
  const int64_t step = blockRows(in);
  if (direct(dtype)) {  // y[:, o:o+n] (+)= x16 w16[o:o+n]^T, the weight rounded a block of rows at a time
    Bits16 wb = buffer16(std::min(step, out) * in);
    for (int64_t o = 0; o < out; o += step) {
      const int64_t n = std::min(step, out - o);
      narrowFloats(w + o * in, wb.get(), n * in, dtype);
      blas16::gemmBf16(false, true, rows, n, in, 1.0f, bits(x16), in, wb.get(), in, bias ? 1.0f : 0.0f, y + o, out);
    }
    if (relu) std::transform(y, y + rows * out, y, [](float v) { return v > 0.0f ? v : 0.0f; });
    return;
  }
  // Blocks of input rows (widened to float32) times blocks of weight rows (rounded), each about 4 MiB:
  // no float32 copy of the whole input or weight. With more than one block of input rows (large
  // batches) the weight blocks are rounded once per input block: a few extra passes over the weight,
  // against a float32 input copy as large as the activation autocast keeps in half.
  Floats xr = buffer(std::min(step, rows) * in);
  Floats wr = buffer(std::min(step, out) * in);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t m = std::min(step, rows - r);
    widenFloats(bits(x16) + r * in, xr.get(), m * in, dtype);  // input rows [r, r + m)
    for (int64_t o = 0; o < out; o += step) {
      const int64_t n = std::min(step, out - o);
      roundFloats(w + o * in, wr.get(), n * in, dtype);  // weight rows [o, o + n)
      // y[r:r+m, o:o+n] (+)= xr wr^T
      blas::sgemm(false, true, m, n, in, 1.0f, xr.get(), in, wr.get(), in, bias ? 1.0f : 0.0f, y + r * out + o, out);
    }
  }
  if (relu) std::transform(y, y + rows * out, y, [](float v) { return v > 0.0f ? v : 0.0f; });
}

Tensor roundGradient16(const Tensor& g, DType dtype) {
  // The gradient the layer after this one returned, held by the caller alone, is a temporary: rounded
  // in place (one activation-sized buffer less at the peak of backward). Anything else (the caller's
  // array, a tensor someone else holds) is copied.
  const bool temporary = !g.borrowed() && g.storage().use_count() == 1;
  Tensor gr = temporary ? g : Tensor::empty(g.shape());
  roundFloats(g.data<float>(), gr.data<float>(), g.numel(), dtype);
  return gr;
}

void linearParamGrads16(const Tensor& x16, const Tensor& gr, float* dw, float* db) {
  const int64_t rows = x16.size(0), in = x16.size(1), out = gr.size(1);
  const float* g = gr.data<float>();
  if (direct(x16.dtype())) {  // dW += g16^T x16 (gr holds bfloat16 values: narrowing it is exact)
    blas16::gemmBf16(true, false, out, in, rows, 1.0f, narrowed(g, rows * out).get(), out, bits(x16), in, 1.0f, dw,
                     in);
  } else {  // dW += sum over row blocks of gr[rows]^T x[rows]: the input widened a block of rows at a time
    const int64_t step = blockRows(in);
    Floats xr = buffer(std::min(step, rows) * in);
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      widenFloats(bits(x16) + r * in, xr.get(), n * in, x16.dtype());
      blas::sgemm(true, false, out, in, n, 1.0f, g + r * out, out, xr.get(), in, 1.0f, dw, in);
    }
  }
  if (db) ops::addColumnSums(Device{}, g, db, rows, out);
}

Tensor linearInputGrad16(const Tensor& gr, const float* w, int64_t in, DType dtype) {
  const int64_t rows = gr.size(0), out = gr.size(1);
  Tensor dx = Tensor::empty({rows, in});
  const int64_t step = blockRows(in);
  if (direct(dtype)) {  // dx = sum over blocks of weight rows [o, o + n): g16[:, o:o+n] w16[o:o+n, :]
    const Bits16 g16 = narrowed(gr.data<float>(), rows * out);  // exact: gr holds bfloat16 values
    Bits16 wb = buffer16(std::min(step, out) * in);
    for (int64_t o = 0; o < out; o += step) {
      const int64_t n = std::min(step, out - o);
      narrowFloats(w + o * in, wb.get(), n * in, dtype);
      blas16::gemmBf16(false, false, rows, in, n, 1.0f, g16.get() + o, out, wb.get(), in, o == 0 ? 0.0f : 1.0f,
                       dx.data<float>(), in);
    }
    if (out == 0) dx.fill(0.0);
    return dx;
  }
  // dx = sum over blocks of weight rows [o, o + n): gr[:, o:o+n] wr[o:o+n, :]
  Floats wr = buffer(std::min(step, out) * in);
  for (int64_t o = 0; o < out; o += step) {
    const int64_t n = std::min(step, out - o);
    roundFloats(w + o * in, wr.get(), n * in, dtype);
    blas::sgemm(false, false, rows, in, n, 1.0f, gr.data<float>() + o, out, wr.get(), in, o == 0 ? 0.0f : 1.0f,
                dx.data<float>(), in);
  }
  if (out == 0) dx.fill(0.0);
  return dx;
}

}  // namespace cyxwiz::nn
