// MultiHeadAttentionModule on a GPU: attention.cpp's forward and backward dispatch CUDA inputs here.
// The same products as the CPU path, as cuBLAS strided batched GEMMs over views of the (N*T, 3E)
// projections (no copies of Q, K, V), attention's masked softmax kernel, softmaxBackward for the
// softmax's Jacobian, and the weights' dropout as a DropoutModule. Float32 under autocast, as the CPU.
#include <cmath>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/nn/attention.h"
#include "cyxwiz/nn/dropout.h"

namespace cyxwiz::nn {

namespace {

// A (T x cols) matrix per (sample, head): base pointer, leading dimension, and the element strides
// from one sample and from one head to the next.
struct HeadView {
  const float* p;
  int64_t ld, perSample, perHead;
};

// C_(n,h) = alpha op(A_(n,h)) op(B_(n,h)) + beta C_(n,h) for every (sample, head): strided batched
// GEMMs over the longer of the two dimensions, looping over the shorter (each dimension alone has a
// constant stride; the pair does not).
void perHead(const Device& device, int64_t N, int64_t H, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
             float alpha, HeadView a, HeadView b, float beta, HeadView c) {
  const bool batchHeads = H >= N;
  const int64_t outer = batchHeads ? N : H, batch = batchHeads ? H : N;
  auto stride = [&](const HeadView& v) { return batchHeads ? v.perHead : v.perSample; };
  auto at = [&](const HeadView& v, int64_t o) { return v.p + o * (batchHeads ? v.perSample : v.perHead); };
  for (int64_t o = 0; o < outer; ++o) {
    CYX_CUDA(gemmStridedBatched(device.index, transA, transB, m, n, k, alpha, at(a, o), a.ld, stride(a), at(b, o), b.ld,
                                stride(b), beta, const_cast<float*>(at(c, o)), c.ld, stride(c), batch));
  }
}

}  // namespace

std::vector<Module*> MultiHeadAttentionModule::innerModules() {
  if (gpuDropout_) return {gpuDropout_.get()};
  return {};
}

void MultiHeadAttentionModule::clearGpuCache() {
  gpuInput_ = gpuQkv_ = gpuAttn_ = gpuProbs_ = gpuDropped_ = Tensor();
  if (gpuDropout_) gpuDropout_->releaseCache();
}

Tensor MultiHeadAttentionModule::forwardGpu(const Tensor& input) {
  requireInput(input, repr() + ".forward", 3, "(N, T, E)");
  outputShape(input.shape());
  const Device device = inWeight_.value.device();
  CYX_CHECK(input.device() == device, repr(), ".forward: the input is on ", input.device().str(),
            " and the parameters on ", device.str(), "; move the model (model.to) or the input to one device");
  const int64_t N = input.size(0), T = input.size(1), E = embed_, H = heads_, dh = E / H, R = N * T;
  CYX_CHECK(T > 0, repr(), ".forward: the sequences are empty");
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  clearGpuCache();
  gpuInput_ = keepForBackward(input);
  gpuQkv_ = Tensor::empty({R, 3 * E}, DType::Float32, device);
  ops::linearForward(device, gpuInput_.deviceData<float>(), inWeight_.value.deviceData<float>(),
                     bias_ ? inBias_.value.deviceData<float>() : nullptr, gpuQkv_.deviceData<float>(), R, E, 3 * E, false);
  const float* qkv = gpuQkv_.deviceData<float>();
  const HeadView q{qkv, 3 * E, T * 3 * E, dh}, k{qkv + E, 3 * E, T * 3 * E, dh}, v{qkv + 2 * E, 3 * E, T * 3 * E, dh};
  // S = scale Q K^T, then the softmax in place: P.
  gpuProbs_ = Tensor::empty({N, H, T, T}, DType::Float32, device);
  const HeadView p{gpuProbs_.deviceData<float>(), T, H * T * T, T * T};
  perHead(device, N, H, false, true, T, T, dh, scale, q, k, 0.0f, p);
  CYX_CUDA(maskedSoftmaxForward(device.index, gpuProbs_.deviceData<float>(), gpuProbs_.deviceData<float>(), N * H * T, T,
                                causal_));
  HeadView weights = p;
  if (training_ && dropout_ > 0.0) {
    if (!gpuDropout_) gpuDropout_ = std::make_shared<DropoutModule>(dropout_);
    gpuDropout_->setTraining(true);
    gpuDropped_ = gpuDropout_->forward(gpuProbs_);
    weights.p = gpuDropped_.deviceData<float>();
  }
  // O = weights V, each head into its columns of gpuAttn_.
  gpuAttn_ = Tensor::empty({R, E}, DType::Float32, device);
  perHead(device, N, H, false, false, T, dh, T, 1.0f, weights, v, 0.0f, HeadView{gpuAttn_.deviceData<float>(), E, T * E, dh});
  Tensor output = Tensor::empty({N, T, E}, DType::Float32, device);
  ops::linearForward(device, gpuAttn_.deviceData<float>(), outWeight_.value.deviceData<float>(),
                     bias_ ? outBias_.value.deviceData<float>() : nullptr, output.deviceData<float>(), R, E, E, false);
  return output;
}

Tensor MultiHeadAttentionModule::backwardGpu(const Tensor& gradOutput) {
  checkBackward(gpuInput_, gradOutput, gpuInput_.shape());
  const Device device = gpuInput_.device();
  const Tensor gt = gradOutput.to(device);
  const int64_t N = gpuInput_.size(0), T = gpuInput_.size(1), E = embed_, H = heads_, dh = E / H, R = N * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const float* g = gt.deviceData<float>();
  // out_proj: dW += g^T attn, db += column sums of g, then the heads' outputs' gradient g W.
  ops::gemm(device, true, false, E, E, R, 1.0f, g, E, gpuAttn_.deviceData<float>(), E, 1.0f,
            outWeight_.grad.deviceData<float>(), E);
  if (bias_) ops::addColumnSums(device, g, outBias_.grad.deviceData<float>(), R, E);
  Tensor dattn = Tensor::empty({R, E}, DType::Float32, device);
  ops::gemm(device, false, false, R, E, E, 1.0f, g, E, outWeight_.value.deviceData<float>(), E, 0.0f,
            dattn.deviceData<float>(), E);
  Tensor dqkv = Tensor::empty({R, 3 * E}, DType::Float32, device);
  const float* qkv = gpuQkv_.deviceData<float>();
  float* dq = dqkv.deviceData<float>();
  const HeadView q{qkv, 3 * E, T * 3 * E, dh}, k{qkv + E, 3 * E, T * 3 * E, dh}, v{qkv + 2 * E, 3 * E, T * 3 * E, dh};
  const HeadView dQ{dq, 3 * E, T * 3 * E, dh}, dK{dq + E, 3 * E, T * 3 * E, dh}, dV{dq + 2 * E, 3 * E, T * 3 * E, dh};
  const HeadView dO{dattn.deviceData<float>(), E, T * E, dh};
  const HeadView p{gpuProbs_.deviceData<float>(), T, H * T * T, T * T};
  const HeadView weights{gpuDropped_.defined() ? gpuDropped_.deviceData<float>() : p.p, T, H * T * T, T * T};
  // dV = weights^T dO; dWeights = dO V^T, then back through the dropout mask.
  perHead(device, N, H, true, false, T, dh, T, 1.0f, weights, dO, 0.0f, dV);
  Tensor dp = Tensor::empty({N, H, T, T}, DType::Float32, device);
  perHead(device, N, H, false, true, T, T, dh, 1.0f, dO, v, 0.0f, HeadView{dp.deviceData<float>(), T, H * T * T, T * T});
  if (gpuDropped_.defined()) dp = gpuDropout_->backward(dp);
  // dS = P (dP - rowsum(dP P)): the softmax's Jacobian; masked keys have P = 0 and get 0.
  Tensor ds = Tensor::empty({N, H, T, T}, DType::Float32, device);
  CYX_CUDA(softmaxBackward(device.index, gpuProbs_.deviceData<float>(), dp.deviceData<float>(), ds.deviceData<float>(),
                           N * H * T, T));
  dp = Tensor();
  const HeadView dS{ds.deviceData<float>(), T, H * T * T, T * T};
  // dQ = scale dS K; dK = scale dS^T Q.
  perHead(device, N, H, false, false, T, dh, T, scale, dS, k, 0.0f, dQ);
  perHead(device, N, H, true, false, T, dh, T, scale, dS, q, 0.0f, dK);
  ds = Tensor();
  // in_proj: dW += dqkv^T x, db += column sums of dqkv, then dx = dqkv W.
  ops::gemm(device, true, false, 3 * E, E, R, 1.0f, dq, 3 * E, gpuInput_.deviceData<float>(), E, 1.0f,
            inWeight_.grad.deviceData<float>(), E);
  if (bias_) ops::addColumnSums(device, dq, inBias_.grad.deviceData<float>(), R, 3 * E);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  Tensor gradInput = Tensor::empty(gpuInput_.shape(), DType::Float32, device);
  ops::gemm(device, false, false, R, E, 3 * E, 1.0f, dq, 3 * E, inWeight_.value.deviceData<float>(), E, 0.0f,
            gradInput.deviceData<float>(), E);
  return gradInput;
}

}  // namespace cyxwiz::nn
