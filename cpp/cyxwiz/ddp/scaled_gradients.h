// DistributedDataParallel's gradients as a GradScaler steps on them (nn/grad_scaler.h).
//
// unscale waits for every bucket's reduction, divides this rank's averaged gradients by the scale
// (the whole bucket, or this rank's part of a reduce-scattered one) and checks them for Inf/NaN; the
// answer is then agreed across ranks (one small all-reduce), so every rank skips the same steps even
// where each rank checks only its own part (sharded step). Averaged gradients are identical on every
// rank anyway: an Inf/NaN on one rank reaches every rank's average.
// step is update_parameters (steps and zeroes the gradients); skip zeroes them without stepping.
#pragma once

#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/nn/grad_scaler.h"

namespace cyxwiz::ddp {

class DDPGradients : public nn::ScaledGradients {
 public:
  explicit DDPGradients(DistributedDataParallel& ddp) : ddp_(ddp) {}
  bool unscale(float factor) override { return ddp_.unscaleGradients(factor); }
  void step(nn::Optimizer& optimizer) override { ddp_.updateParameters(optimizer); }
  void skip() override { ddp_.zeroGrad(); }

 private:
  DistributedDataParallel& ddp_;
};

}  // namespace cyxwiz::ddp
