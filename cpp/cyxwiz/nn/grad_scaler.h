// GradScaler: dynamic loss scaling for float16 mixed precision, as torch.amp.GradScaler.
//
// float16 holds nothing below 2^-24 and nothing above 65504. Gradients rounded to float16 in backward
// (nn/autocast.h) would mostly underflow to zero at their natural size, so the loss gradient is
// multiplied by the scale S before backward (scale()), every gradient comes out S times too big, and
// the step divides them back (unscale) before the optimizer sees them. When a gradient holds Inf or
// NaN (S was too big: something overflowed), the step is skipped and S shrinks (backoffFactor);
// after growthInterval steps in a row without one, S grows (growthFactor). One iteration:
//
//   model.backward(scaler.scale(loss_grad))   every gradient is S times its true value
//   scaler.step(optimizer, gradients)         unscale (unless unscale() ran), then step or skip
//   scaler.update()                           back off after an Inf/NaN, grow after growthInterval good steps
//
// The gradients are stepped through ScaledGradients: a model's own (ModelGradients), or
// DistributedDataParallel's (ddp/scaled_gradients.h), whose Inf/NaN check gives the same answer on
// every rank, so every rank skips the same steps and the replicas stay identical.
// Disabled (enabled=false), every call is a pass-through: scale() returns its input, step() steps.
#pragma once

#include <cstdint>
#include <string>

#include "cyxwiz/nn/optimizer.h"
#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::nn {

struct GradScalerOptions {
  double initScale = 65536.0;  // 2^16, torch's default
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  bool enabled = true;
};

// What a checkpoint keeps; the keys of state_dict() are torch's ("scale", "growth_factor",
// "backoff_factor", "growth_interval", "_growth_tracker").
struct GradScalerState {
  double scale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  int64_t growthTracker = 0;  // good steps in a row since the scale last changed
};

// The gradients a GradScaler steps on.
class ScaledGradients {
 public:
  virtual ~ScaledGradients() = default;
  // Multiplies every gradient by `factor`; false when any holds Inf or NaN.
  virtual bool unscale(float factor) = 0;
  virtual void step(Optimizer& optimizer) = 0;
  // The step is skipped (its gradients held Inf/NaN).
  virtual void skip() = 0;
};

// A model's own gradients: step is optimizer.step(model); skip leaves the gradients to the caller's
// zero_grad, as a step would.
class ModelGradients : public ScaledGradients {
 public:
  explicit ModelGradients(SequentialModel& model) : model_(model) {}
  bool unscale(float factor) override;
  void step(Optimizer& optimizer) override;
  void skip() override {}

 private:
  SequentialModel& model_;
};

// g[i] *= factor for i in [0, n); false when any result is Inf or NaN (the loop runs to the end).
bool unscaleInPlace(float* g, int64_t n, float factor);

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  bool enabled() const { return enabled_; }
  // The current scale; 1 when disabled.
  double scale() const { return enabled_ ? state_.scale : 1.0; }
  // A copy of `lossGradient` (float32, on the host) times the scale; the tensor itself when disabled.
  Tensor scale(const Tensor& lossGradient) const;
  // Divides the gradients by the scale once per iteration (call it before reading or clipping them);
  // returns whether they are all finite. step() then does not unscale again.
  bool unscale(ScaledGradients& gradients);
  // unscale (unless done), then optimizer.step through `gradients`, or skip it when a gradient holds
  // Inf/NaN. Returns whether the step was taken.
  bool step(Optimizer& optimizer, ScaledGradients& gradients);
  // After each step(): the scale backs off when that step was skipped and grows after
  // growthInterval good steps in a row.
  void update();
  // Sets the scale (torch's update(new_scale)); the growth count starts again.
  void update(double newScale);
  // Whether the last step() found Inf/NaN and skipped the step.
  bool lastStepSkipped() const { return lastSkipped_; }

  GradScalerState state() const { return state_; }
  void loadState(const GradScalerState& state);
  std::string repr() const;

 private:
  enum class Stage { Ready, Unscaled, Stepped };  // within one iteration, reset by update()
  static void check(const GradScalerState& s, const char* who);

  bool enabled_;
  GradScalerState state_;
  Stage stage_ = Stage::Ready;
  bool foundInf_ = false;
  bool lastSkipped_ = false;
};

}  // namespace cyxwiz::nn
