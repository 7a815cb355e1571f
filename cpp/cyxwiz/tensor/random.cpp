#include "cyxwiz/tensor/random.h"

namespace cyxwiz {

// Fixed like PyTorch's default generator: two fresh processes build the same model unless told otherwise.
uint64_t defaultSeed() { return 67280421310721ULL; }

std::mt19937_64& globalGenerator() {
  static std::mt19937_64 generator(defaultSeed());
  return generator;
}

void manualSeed(uint64_t seed) { globalGenerator().seed(seed); }

}  // namespace cyxwiz
