#include "cyxwiz/tensor/random.h"

#include <sstream>

#include "cyxwiz/common/error.h"

namespace cyxwiz {

// Fixed like PyTorch's default generator: two fresh processes build the same model unless told otherwise.
uint64_t defaultSeed() { return 67280421310721ULL; }

std::mt19937_64& globalGenerator() {
  static std::mt19937_64 generator(defaultSeed());
  return generator;
}

void manualSeed(uint64_t seed) { globalGenerator().seed(seed); }

std::string generatorState() {
  std::ostringstream out;
  out << globalGenerator();
  return out.str();
}

void setGeneratorState(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail() || !(in >> std::ws).eof()) {
    throw InvalidArgument("set_rng_state: not a state returned by cx.get_rng_state()");
  }
  globalGenerator() = restored;
}

}  // namespace cyxwiz
