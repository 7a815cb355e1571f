// TEST DOUBLE, NOT GPU SUPPORT. The launch of cpp/cyxwiz/cuda/blas.cu on the host: C = beta C for a
// GEMM with k = 0, through kernel_math.h's scaleMatrixElement.
#include "cyxwiz/cuda/kernel_math.h"
#include "cyxwiz/cuda/launch.h"
#include "kernels/access.h"
#include "runtime/emu.h"

namespace cyxwiz::cuda {

void launchScaleMatrix(cudaStream_t s, float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  // Rows 0..m-1 of n elements at a stride of ldc: from c[0] to c[(m - 1) ldc + n - 1].
  cxemu::enqueue(s, "scaleMatrixKernel", {emulated::writes(c, (m - 1) * ldc + n)}, [=] {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) scaleMatrixElement(c, r, j, ldc, beta);
    }
  });
}

}  // namespace cyxwiz::cuda
