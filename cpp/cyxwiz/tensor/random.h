// The engine's one random stream: weight initialisation and dropout masks draw from it,
// so cx.manual_seed(n) makes both reproducible. Values are identical on every platform.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

namespace cyxwiz {

std::mt19937_64& globalGenerator();
void manualSeed(uint64_t seed);
uint64_t defaultSeed();
// The generator's full state as text (checkpoints save it so a resumed run draws the same numbers).
std::string generatorState();
// Restores a state from generatorState(); throws InvalidArgument for anything else.
void setGeneratorState(const std::string& state);

// Uniform float in [0, 1) from the top 24 bits of one draw (exact in float32, portable).
inline float uniform01(std::mt19937_64& gen) { return static_cast<float>(gen() >> 40) * (1.0f / 16777216.0f); }

// out[i] ~ U(-bound, bound), one draw each in order: torch's kaiming_uniform_(a=sqrt(5)) of a layer with
// fan_in inputs per output is bound = 1/sqrt(fan_in), its bias the same bound.
inline void fillUniform(float* out, int64_t n, float bound, std::mt19937_64& gen) {
  for (int64_t i = 0; i < n; ++i) out[i] = (2.0f * uniform01(gen) - 1.0f) * bound;
}

// out[i] ~ N(0, 1) by Box-Muller over pairs of uniform01 draws (portable, unlike std::normal_distribution):
// torch.nn.Embedding's initialisation.
inline void fillNormal(float* out, int64_t n, std::mt19937_64& gen) {
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - uniform01(gen), u2 = uniform01(gen);  // u1 in (0, 1]: log is finite
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 6.283185307179586 * u2;
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < n) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

}  // namespace cyxwiz
