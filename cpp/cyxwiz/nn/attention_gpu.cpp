// MultiHeadAttentionModule on a GPU: attention.cpp's forward and backward dispatch CUDA inputs here.
// The same products as the CPU path, as cuBLAS strided batched GEMMs over views of the (N*T, 3E)
// projections (no copies of Q, K, V), attention's masked softmax kernel, softmaxBackward for the
// softmax's Jacobian, and the weights' dropout as a DropoutModule. Under autocast as on the CPU: the
// projections multiply 16-bit operands with float32 accumulation (LinearModule's calls), Q, K and V are
// rounded to the 16-bit type, and the core stays float32.
#include <cmath>
#include <optional>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/device/ops.h"
#include "cyxwiz/device/ops16.h"
#include "cyxwiz/nn/attention.h"
#include "cyxwiz/nn/autocast.h"
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

// y (rows, out) = x w^T (+ b), x (rows, in): float32, or with 16-bit x (autocast's copy) and a 16-bit
// copy of w, returned for backward's dx (cast once a step, as LinearModule does).
Tensor project(const Tensor& x, const Parameter& w, const Parameter* b, Tensor& y) {
  const Device device = w.value.device();
  const int64_t rows = x.size(0), in = x.size(1), out = w.value.size(0);
  const float* bias = b ? b->value.deviceData<float>() : nullptr;
  if (x.dtype() == DType::Float32) {
    ops::linearForward(device, x.deviceData<float>(), w.value.deviceData<float>(), bias, y.deviceData<float>(), rows, in,
                       out, false);
    return Tensor();
  }
  Tensor w16 = ops::narrowOnDevice(w.value, x.dtype());
  ops::linearForward16(x, w16, bias, y, false);
  return w16;
}

// project's backward, its parameters: w's gradient += g^T x, b's += the column sums of g. With 16-bit x
// (autocast) g is rounded to its type once and the product takes 16-bit operands, as LinearModule's
// backward16Gpu. Returns g as the products take it, for projectInputGrad.
Tensor projectParamGrads(const Tensor& g, const Tensor& x, Parameter& w, Parameter* b) {
  const Device device = w.value.device();
  const int64_t rows = x.size(0), in = x.size(1), out = w.value.size(0);
  if (x.dtype() == DType::Float32) {
    ops::gemm(device, true, false, out, in, rows, 1.0f, g.deviceData<float>(), out, x.deviceData<float>(), in, 1.0f,
              w.grad.deviceData<float>(), in);
    if (b) ops::addColumnSums(device, g.deviceData<float>(), b->grad.deviceData<float>(), rows, out);
    return g;
  }
  const DType dtype = x.dtype();
  Tensor g16 = ops::narrowOnDevice(g, dtype);
  ops::gemm16(device, dtype, true, false, out, in, rows, 1.0f, g16, out, x, in, 1.0f, w.grad.deviceData<float>(), in);
  if (b) ops::addColumnSums16(g16, b->grad.deviceData<float>());
  return g16;
}

// dx = g w, g as projectParamGrads returned it; w16 is forward's 16-bit copy of w when g is 16-bit.
Tensor projectInputGrad(const Tensor& g, const Parameter& w, const Tensor& w16) {
  const Device device = w.value.device();
  const int64_t rows = g.size(0), out = w.value.size(0), in = w.value.size(1);
  Tensor dx = Tensor::empty({rows, in}, DType::Float32, device);
  if (g.dtype() == DType::Float32) {
    ops::gemm(device, false, false, rows, in, out, 1.0f, g.deviceData<float>(), out, w.value.deviceData<float>(), in,
              0.0f, dx.deviceData<float>(), in);
    return dx;
  }
  CYX_CHECK(w16.defined(), "MultiHeadAttentionModule.backward: the 16-bit weight copy of the autocast forward is gone "
            "(a second backward after one forward?); run forward again before backward");
  ops::gemm16(device, g.dtype(), false, false, rows, in, out, 1.0f, g, out, w16, in, 0.0f, dx.deviceData<float>(), in);
  return dx;
}

}  // namespace

std::vector<Module*> MultiHeadAttentionModule::innerModules() {
  if (gpuDropout_) return {gpuDropout_.get()};
  return {};
}

void MultiHeadAttentionModule::clearGpuCache() {
  gpuInput_ = gpuQkv_ = gpuAttn_ = gpuProbs_ = gpuDropped_ = gpuInWeight16_ = gpuOutWeight16_ = Tensor();
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
  const std::optional<DType> half = autocastDtype();
  gpuInput_ = half ? narrowActivation(input, *half) : keepForBackward(input);
  gpuQkv_ = Tensor::empty({R, 3 * E}, DType::Float32, device);
  gpuInWeight16_ = project(gpuInput_.reshape({R, E}), inWeight_, bias_ ? &inBias_ : nullptr, gpuQkv_);
  if (half) ops::roundOnDevice(gpuQkv_, *half);  // as torch's 16-bit projection hands Q, K, V to attention
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
  if (half) gpuAttn_ = ops::narrowOnDevice(gpuAttn_, *half);  // out_proj's kept input
  Tensor output = Tensor::empty({R, E}, DType::Float32, device);
  gpuOutWeight16_ = project(gpuAttn_, outWeight_, bias_ ? &outBias_ : nullptr, output);
  return output.reshape({N, T, E});
}

Tensor MultiHeadAttentionModule::backwardGpu(const Tensor& gradOutput) {
  checkBackward(gpuInput_, gradOutput, gpuInput_.shape());
  const Device device = gpuInput_.device();
  const Tensor gt = gradOutput.to(device);
  const int64_t N = gpuInput_.size(0), T = gpuInput_.size(1), E = embed_, H = heads_, dh = E / H, R = N * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  // out_proj: its parameters' gradients, then the heads' outputs' gradient g W.
  const Tensor gOut = projectParamGrads(gt.reshape({R, E}), gpuAttn_, outWeight_, bias_ ? &outBias_ : nullptr);
  Tensor dattn = projectInputGrad(gOut, outWeight_, gpuOutWeight16_);
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
  // in_proj: its parameters' gradients, then dx = dqkv W.
  dattn = Tensor();
  const Tensor gIn = projectParamGrads(dqkv, gpuInput_.reshape({R, E}), inWeight_, bias_ ? &inBias_ : nullptr);
  gradsReady();
  if (!needInputGrad_) return Tensor();
  return projectInputGrad(gIn, inWeight_, gpuInWeight16_).reshape(gpuInput_.shape());
}

}  // namespace cyxwiz::nn
