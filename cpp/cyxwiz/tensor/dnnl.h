// Convolutions from oneDNN (the onednn-cpu-gomp wheel, loaded at run time like oneMKL in blas16.h):
// its JIT kernels for this CPU's widest vector units (AVX-512 where the CPU has it, on any vendor)
// behind Conv2DModule, in place of im2col + OpenBLAS sgemm. Plain NCHW/OIHW arrays go in and out; the
// blocked layouts oneDNN prefers are reorders inside each call, as torch's eager CPU convolution does.
// Optional: without the library, with CYXWIZ_ONEDNN=0, or for a shape oneDNN refuses, the im2col path
// runs. Threads follow cx.set_num_threads (OpenMP threads of the library's libgomp).
#pragma once

#include <cstdint>
#include <string>

namespace cyxwiz::dnnl {

// Where libdnnl is; opened at the first convolution, not before. An empty path forgets it.
void setLibrary(const std::string& path);
// Whether convolutions go to oneDNN: a library is set, opens, has every symbol, and is enabled.
bool available();
// Tests and benchmarks: route convolutions to oneDNN (true, when available) or to im2col.
void setEnabled(bool enabled);
// "oneDNN 3.2.0 (convolution, bfloat16 matmul, bfloat16 convolution) from PATH", or why not; without
// bfloat16 convolutions on this CPU (probed once) it says so instead of the last item.
std::string info();

// A 2-D convolution as torch.nn.Conv2d computes it, float32, NCHW input, (O, C/groups, kh, kw) weight.
struct ConvShape {
  int64_t batch, channels, height, width, outChannels, outHeight, outWidth;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias;
  // Mixed precision: bfloat16 operands (the input is bfloat16 bits; the weight and the gradient are
  // float32, rounded by the reorders into the kernel's layout), float32 results. False: all float32.
  bool bf16 = false;
  bool operator==(const ConvShape& o) const;
};

// Whether the library is loaded, whatever setEnabled says (the bfloat16 products of blas16.h ask).
bool loaded();

// Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta C with A and B bfloat16 bits and C float32, beta 0 or
// 1: oneDNN's matmul (what torch's CPU autocast uses). False when oneDNN has no kernel for it.
bool gemmBf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Each returns false when oneDNN has no kernel for the shape (the caller then computes it itself).
// y = conv(x, w) + b; x is float32, or bfloat16 bits when s.bf16
bool convForward(const ConvShape& s, const void* x, const float* w, const float* b, float* y);
// dw += dconv/dw, db += the sums of dy (when b and db are given); x as in convForward
bool convBackwardWeights(const ConvShape& s, const void* x, const float* dy, float* dw, float* db);
// dx = dconv/dx
bool convBackwardData(const ConvShape& s, const float* dy, const float* w, float* dx);

}  // namespace cyxwiz::dnnl
