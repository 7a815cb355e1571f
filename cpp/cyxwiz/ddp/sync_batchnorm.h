// SyncBatchNorm: BatchNorm layers whose batch statistics are those of every rank's rows together
// (nn/batchnorm.h), reduced over the current job's backend.
#pragma once

#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::ddp {

// Makes every BatchNorm1D/2DModule of `model` (inside residual blocks too) synchronised, as
// torch.nn.SyncBatchNorm.convert_sync_batchnorm; returns how many it changed. Installs the reduction.
int convertSyncBatchNorm(nn::SequentialModel& model);
// Points synchronised BatchNorm layers at the job's backend (an all-reduce SUM of float64 on the
// caller's thread, in issue order with the gradient buckets); without a job of more than one rank
// they use their own rows, as torch's.
void installSyncBatchNorm();

}  // namespace cyxwiz::ddp
