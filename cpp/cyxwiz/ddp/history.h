// What fit() reports, per epoch and overall. Every rank holds the same values: the metrics are
// reduced across ranks before they are recorded.
#pragma once

#include <cstdint>
#include <vector>

namespace cyxwiz::ddp {

struct TrainingHistory {
  std::vector<double> trainLosses, trainAccuracies, valLosses, valAccuracies;
  double totalTimeSeconds = 0.0;
  double samplesPerSecond = 0.0;  // all ranks' training samples / wall time of the training loop
  int64_t effectiveBatchSize = 0;  // batch size x world size
  int worldSize = 1;
  int64_t startEpoch = 0;  // epochs a loaded checkpoint had already done
};

}  // namespace cyxwiz::ddp
