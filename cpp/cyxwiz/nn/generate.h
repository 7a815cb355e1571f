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
// useCache: a CPU model whose every layer can decode (Module::canDecode: embedding, positions, causal
// Transformer blocks or attention, norms, linears, activations) runs the prompt once and then one token a
// step, its attention keeping every token's keys and values, until the window slides (past max_len every
// position moves, so each step runs the whole window again, as without the cache). Other models ignore it.
Tensor generate(SequentialModel& model, const Tensor& prompt, int64_t maxNewTokens, double temperature = 1.0,
                std::optional<int64_t> topK = std::nullopt, uint64_t seed = 0, bool useCache = true);

}  // namespace cyxwiz::nn
