// Sums over interleaved lanes for the per-row loops (LayerNorm, the softmaxes): element i goes to lane
// i % kLanes, and the lanes are added in lane order, so a loop vectorises (one chain of dependent double
// adds costs about 4 cycles an element) and every CPU gets the same bits.
#pragma once

#include <cstdint>

namespace cyxwiz::nn {

constexpr int64_t kLanes = 8;

inline double laneTotal(const double* lanes) {
  double sum = 0.0;
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

}  // namespace cyxwiz::nn
