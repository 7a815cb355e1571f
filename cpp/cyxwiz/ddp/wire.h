// Gradients as they travel between ranks (DDPConfig::gradientDtype). A bucket's float32 gradients
// are rounded into a 16-bit copy of the bucket (bfloat16 or float16), that copy is reduced (the CPU
// transports widen each element to float32, combine and round back; NCCL reduces 16-bit types itself,
// rounding after every operation), and the result is widened back
// into the float32 gradients, which the optimizer and the caller read as before. Half the bytes on
// every link; the optimizer, its state and the parameters stay float32.
//
// On one host, a bucket the ranks share and larger than the shared window's half skips the copy: the
// backend reads the peers' float32 buckets and rounds as it reads (Backend::allReduceRounded), with the
// same bits.
//
// Host tensors are converted by tensor/convert16.h's loops (cloned per instruction set); GPU tensors
// by a kernel on the device's compute stream (cuda::Api::convertFloats), queued like any other kernel
// (so a CUDA graph captures it), with the same bits as the host's (cyxwiz/tensor/half.h).
#pragma once

#include <cstdint>
#include <string>

#include "cyxwiz/tensor/tensor.h"

namespace cyxwiz::ddp {

// "float32", "bfloat16" or "float16" (numpy/torch spelling); anything else is refused with the choices.
DType parseGradientDtype(const std::string& name);

// wire[i] = round(grads[i] * scale), nearest-even, for every element (scale 1/N pre-divides float16
// sums so that they cannot overflow, as torch's fp16_compress_hook).
void narrowGradients(const Tensor& grads, const Tensor& wire, float scale);
// grads[i] = wire[i] for i in [first, last): a reduce-scattered bucket is averaged in this rank's part only.
// Both tensors on one device, the CPU or a GPU.
void widenGradients(const Tensor& wire, const Tensor& grads, int64_t first, int64_t last);

}  // namespace cyxwiz::ddp
