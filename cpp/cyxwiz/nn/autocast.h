// Autocast: mixed precision for hand-written loops and DistributedTrainer, as torch.autocast on the CPU.
//
// Inside an AutocastGuard(BFloat16 or Float16) on this thread:
//   LinearModule   rounds its input and its weight to the 16-bit type (nearest-even, tensor/half.h)
//                  and multiplies them with float32 accumulation (the BLAS has no 16-bit GEMM:
//                  scipy-openblas32 exports no sbgemm, and the 16-bit values are widened to float32
//                  operands, which is exact); the input it keeps for backward is the 16-bit copy.
//   ReLUModule     keeps the 16-bit copy of what it saw; its mask is that copy's sign, as a ReLU on
//                  a 16-bit tensor has it. Fused behind a LinearModule (SequentialModel), the ReLU
//                  and the next LinearModule share ONE 16-bit copy of the activation (shareNarrowed).
// Everything else is unchanged: parameters (master weights), their gradients and the optimizer state
// stay float32, so do the bias, the losses, softmax and the other activations, and every value
// passed between layers is float32. Backward follows what forward did, whether or not it runs inside
// the guard (torch's scripts call backward outside autocast): a LinearModule that kept a 16-bit input
// rounds the incoming gradient to the same type and uses 16-bit operands again
// (dW += round(g)^T x16, db += colsum(round(g)), dx = round(g) round(W)).
//
// The state is per thread, as torch's: a guard applies to the forward calls its thread makes, and
// the threads the engine starts (communication, BLAS) compute no layers. Outside every guard nothing
// changes: float32 results are bit-identical to a build without autocast.
//
// On a GPU the same happens on the device: the 16-bit copies are made by a cast kernel (the same
// rounding, bit for bit), the GEMMs are cuBLASLt matmuls with 16-bit A/B and CUBLAS_COMPUTE_32F
// (tensor cores, float32 accumulation; the bias and ReLU in the matmul's epilogue), and the layer also
// keeps the 16-bit weight copy its forward made for backward's dx (so the weight is cast once a step).
// The results equal the CPU path's up to the order of the float32 additions.
#pragma once

#include <optional>
#include <string>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::nn {

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::BFloat16;  // BFloat16 or Float16
};

// This thread's state.
AutocastState autocastState();
// The 16-bit type the layers compute with now, or nullopt outside autocast.
std::optional<DType> autocastDtype();

// "bfloat16"/"bf16" or "float16"/"fp16"; anything else is refused naming `who` and the choices.
DType parseAutocastDtype(const std::string& name, const std::string& who);

// Sets this thread's state for its lifetime and restores the previous one after (guards nest; an
// enabled=false guard switches autocast off inside an autocast region, as torch's).
class AutocastGuard {
 public:
  AutocastGuard(DType dtype, bool enabled = true);
  explicit AutocastGuard(const AutocastState& state);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

// The 16-bit copy of a float32 activation `x` (on x's device), for a module to keep for backward. A ReLU fused
// behind a LinearModule makes it from the Linear's output and offers it here; the next LinearModule,
// asking for the copy of that same tensor, gets the very copy instead of making another, so the pair
// keeps one 16-bit activation (2 bytes an element where float32 training keeps 4). One offer is
// held at a time, on this thread, and only while `x`'s storage lives; a hit consumes it.
Tensor narrowActivation(const Tensor& x, DType dtype, bool offer = false);

}  // namespace cyxwiz::nn
