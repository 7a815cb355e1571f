// Text generation for a causal language model: token ids in, the ids it continues them with out.
#pragma once

#include <cstdint>
#include <optional>

#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::nn {

// `prompt` (N, T0) int64 ids -> (N, T0 + maxNewTokens) ((T0,) -> (T0 + maxNewTokens,)): each step runs the model (in eval mode, restored
// after) on the last `context` ids, where context is the model's PositionalEncodingModule max_len (the
// whole sequence without one), turns the last position's logits into probabilities
// softmax(logits / temperature), keeps the top_k largest when given, and draws the next id from a
// generator seeded with `seed` (the same seed, the same text). temperature 0 takes the argmax.
Tensor generate(SequentialModel& model, const Tensor& prompt, int64_t maxNewTokens, double temperature = 1.0,
                std::optional<int64_t> topK = std::nullopt, uint64_t seed = 0);

}  // namespace cyxwiz::nn
