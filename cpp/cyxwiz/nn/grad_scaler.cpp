#include "cyxwiz/nn/grad_scaler.h"

#include <cmath>
#include <cstring>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/ops16.h"

namespace cyxwiz::nn {

bool unscaleInPlace(float* g, int64_t n, float factor) {
  // An exponent of all ones is Inf or NaN: OR-ing the exponent bits of non-finite values only, the
  // loop vectorises and reads every element once.
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = g[i] * factor;
    g[i] = v;
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

bool ModelGradients::unscale(float factor) {
  model_.guardGradients(SequentialModel::GradientUse::Read);  // waits for DDP's in-flight all-reduces, if any
  bool finite = true;
  const std::vector<Parameter*> params = model_.parameters();
  if (!params.empty() && params.front()->grad.isCuda()) {  // a model lives on one device
    std::vector<ops::FloatSpan> spans;
    for (Parameter* p : params) spans.push_back({p->grad.deviceData<float>(), p->grad.numel()});
    return ops::unscaleOnDevice(params.front()->grad.device().index, spans, factor);
  }
  for (Parameter* p : params) finite = unscaleInPlace(p->grad.data<float>(), p->grad.numel(), factor) && finite;
  return finite;
}

void ModelGradients::step(Optimizer& optimizer) { optimizer.step(model_); }

GradScaler::GradScaler(const GradScalerOptions& options) : enabled_(options.enabled) {
  state_ = {options.initScale, options.growthFactor, options.backoffFactor, options.growthInterval, 0};
  check(state_, "GradScaler");
}

void GradScaler::check(const GradScalerState& s, const char* who) {
  CYX_CHECK(std::isfinite(s.scale) && s.scale > 0, who, ": scale ", s.scale, " must be positive and finite");
  CYX_CHECK(std::isfinite(s.growthFactor) && s.growthFactor > 1.0, who, ": growth_factor ", s.growthFactor,
            " must be > 1");
  CYX_CHECK(s.backoffFactor > 0.0 && s.backoffFactor < 1.0, who, ": backoff_factor ", s.backoffFactor,
            " must be in (0, 1)");
  CYX_CHECK(s.growthInterval > 0, who, ": growth_interval ", s.growthInterval, " must be positive");
  CYX_CHECK(s.growthTracker >= 0, who, ": _growth_tracker ", s.growthTracker, " must be >= 0");
}

Tensor GradScaler::scale(const Tensor& lossGradient) const {
  if (!enabled_) return lossGradient;
  CYX_CHECK(lossGradient.dtype() == DType::Float32, "GradScaler.scale: expected a float32 loss gradient, got ",
            dtypeName(lossGradient.dtype()), " on ", lossGradient.device().str());
  Tensor out = Tensor::empty(lossGradient.shape(), DType::Float32, lossGradient.device());
  const float s = static_cast<float>(state_.scale);
  if (lossGradient.isCuda()) {  // the same float32 product, on the device
    ops::scaleOnDevice(out.device().index, lossGradient.deviceData<float>(), out.deviceData<float>(), out.numel(), s);
    return out;
  }
  const float* in = lossGradient.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = in[i] * s;
  return out;
}

bool GradScaler::unscale(ScaledGradients& gradients) {
  if (!enabled_) return true;
  CYX_CHECK(stage_ == Stage::Ready, "GradScaler.unscale_: ",
            stage_ == Stage::Unscaled ? "unscale_() has already been called since the last update()"
                                      : "unscale_() is being called after step(); call update() first");
  // The inverse in double, then float32, as torch's (exact for the powers of two the scale usually is).
  foundInf_ = !gradients.unscale(static_cast<float>(1.0 / state_.scale));
  stage_ = Stage::Unscaled;
  return !foundInf_;
}

bool GradScaler::step(Optimizer& optimizer, ScaledGradients& gradients) {
  if (!enabled_) {
    gradients.step(optimizer);
    return true;
  }
  CYX_CHECK(stage_ != Stage::Stepped, "GradScaler.step: step() has already been called since the last update()");
  if (stage_ == Stage::Ready) unscale(gradients);
  stage_ = Stage::Stepped;
  lastSkipped_ = foundInf_;
  if (foundInf_) {
    gradients.skip();
    return false;
  }
  gradients.step(optimizer);
  return true;
}

void GradScaler::update() {
  if (!enabled_) return;
  CYX_CHECK(stage_ != Stage::Ready, "GradScaler.update: no step() or unscale_() since the last update(); "
            "call scaler.step(optimizer, model) first");
  if (foundInf_) {
    state_.scale *= state_.backoffFactor;
    state_.growthTracker = 0;
  } else if (++state_.growthTracker >= state_.growthInterval) {
    const double grown = state_.scale * state_.growthFactor;
    if (std::isfinite(static_cast<float>(grown))) state_.scale = grown;  // the scale stays a finite float32
    state_.growthTracker = 0;
  }
  stage_ = Stage::Ready;
  foundInf_ = false;
}

void GradScaler::update(double newScale) {
  if (!enabled_) return;
  CYX_CHECK(std::isfinite(newScale) && newScale > 0, "GradScaler.update: new_scale ", newScale,
            " must be positive and finite");
  state_.scale = newScale;
  state_.growthTracker = 0;
  stage_ = Stage::Ready;
  foundInf_ = false;
}

void GradScaler::loadState(const GradScalerState& state) {
  check(state, "GradScaler.load_state_dict");
  state_ = state;
  stage_ = Stage::Ready;
  foundInf_ = false;
}

std::string GradScaler::repr() const {
  return makeString("GradScaler(scale=", state_.scale, ", growth_factor=", state_.growthFactor, ", backoff_factor=",
                    state_.backoffFactor, ", growth_interval=", state_.growthInterval, ", enabled=",
                    enabled_ ? "True" : "False", ")");
}

}  // namespace cyxwiz::nn
