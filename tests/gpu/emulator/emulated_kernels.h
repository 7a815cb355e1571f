// TEST DOUBLE, NOT GPU SUPPORT. The arithmetic of the host emulator (emulated_cuda.cpp): the
// formulas of the CUDA kernels of cyxwiz/cuda/*.cu, written again on the host. Nothing here checks
// an argument: emulated_cuda.cpp validates every pointer and size before a kernel runs, either at
// once or at each replay of a captured graph. Hidden by -fvisibility=hidden, like everything but
// cyxwiz_cuda_api.
#pragma once

#include <cstdint>

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda::emulated {

bool knownActivation(Activation f);

// C = alpha op(A) op(B) + beta C, row-major, accumulated in double and rounded once per element.
// beta = 0 never reads C; k <= 0 computes C = beta C (nothing at all when beta = 1), as blas.cu.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void broadcastRows(const float* row, float* out, int64_t rows, int64_t cols);
void addColumnSums(const float* g, float* out, int64_t rows, int64_t cols);
void reluInPlace(float* y, int64_t n);

void activationForward(Activation f, const float* x, float* y, int64_t n);
void activationBackward(Activation f, const float* x, const float* g, float* dx, int64_t n);
void multiply(const float* a, const float* b, float* out, int64_t n);
// kernels_elementwise.cu's counter-based stream: the mask is bit-identical to the GPU's.
void dropoutForward(const float* x, float* y, float* mask, int64_t n, float keep, uint64_t seed);
void softmaxForward(const float* x, float* y, int64_t rows, int64_t cols);
void softmaxBackward(const float* y, const float* g, float* dx, int64_t rows, int64_t cols);

// The sum of the row losses (labels in [0, classes), checked by the caller) or of the soft-target ones.
double crossEntropySum(const float* logits, const int64_t* labels, const float* probs, int64_t rows, int64_t classes);
void crossEntropyBackward(const float* logits, const int64_t* labels, const float* probs, float* grad, int64_t rows,
                          int64_t classes);
double squaredErrorSum(const float* y, const float* t, int64_t n);
void mseBackward(const float* y, const float* t, float* grad, int64_t n);
// Rows whose argmax (first maximum, NaNs skipped) equals the label or the target row's argmax.
int64_t countCorrect(const float* logits, const int64_t* labels, const float* probs, int64_t rows, int64_t classes);

// Same bits as the loops of nn/sgd.cpp and nn/adam.cpp.
void sgdStep(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weightDecay,
             bool nesterov);
void adamStep(float* p, const float* g, float* m, float* v, int64_t n, float stepSize, float b1, float b2, float eps,
              float invSqrtBc2, float l2, float decay);

}  // namespace cyxwiz::cuda::emulated
