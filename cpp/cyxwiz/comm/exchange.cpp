#include "cyxwiz/comm/exchange.h"

#include <algorithm>
#include <cstring>

namespace cyxwiz::comm {

namespace {

// Bytes travel as int64 words: the collectives move numeric tensors.
int64_t wordsFor(size_t bytes) { return static_cast<int64_t>((bytes + 7) / 8); }

Tensor int64Tensor(std::vector<int64_t>& v) {
  return Tensor::fromExternal(v.data(), {static_cast<int64_t>(v.size())}, DType::Int64, nullptr);
}

}  // namespace

std::vector<std::string> allGatherStrings(Backend& backend, const std::string& mine) {
  const int world = backend.worldSize();
  std::vector<int64_t> length{static_cast<int64_t>(mine.size())};
  std::vector<int64_t> lengths(static_cast<size_t>(world));
  backend.allGather(int64Tensor(length), int64Tensor(lengths), false)->wait();
  const int64_t words = wordsFor(static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end())));
  std::vector<int64_t> block(static_cast<size_t>(std::max<int64_t>(words, 1)), 0);
  std::memcpy(block.data(), mine.data(), mine.size());
  std::vector<int64_t> all(block.size() * static_cast<size_t>(world));
  backend.allGather(int64Tensor(block), int64Tensor(all), false)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const char* start = reinterpret_cast<const char*>(all.data() + r * block.size());
    out.emplace_back(start, static_cast<size_t>(lengths[r]));
  }
  return out;
}

std::vector<uint8_t> broadcastBytes(Backend& backend, const std::vector<uint8_t>& bytes, int src) {
  const bool isSource = backend.rank() == src;
  std::vector<int64_t> length{isSource ? static_cast<int64_t>(bytes.size()) : 0};
  backend.broadcast(int64Tensor(length), src, false)->wait();
  std::vector<int64_t> words(static_cast<size_t>(wordsFor(static_cast<size_t>(length[0]))), 0);
  if (isSource && !bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  backend.broadcast(int64Tensor(words), src, false)->wait();
  if (isSource) return bytes;
  const uint8_t* start = reinterpret_cast<const uint8_t*>(words.data());
  return std::vector<uint8_t>(start, start + length[0]);
}

std::vector<double> allReduceSum(Backend& backend, std::vector<double> values) {
  Tensor t = Tensor::fromExternal(values.data(), {static_cast<int64_t>(values.size())}, DType::Float64, nullptr);
  backend.allReduce(t, ReduceOp::Sum, false)->wait();
  return values;
}

std::vector<double> allGatherDoubles(Backend& backend, const std::vector<double>& mine) {
  std::vector<double> in = mine;
  std::vector<double> out(mine.size() * static_cast<size_t>(backend.worldSize()));
  Tensor tin = Tensor::fromExternal(in.data(), {static_cast<int64_t>(in.size())}, DType::Float64, nullptr);
  Tensor tout = Tensor::fromExternal(out.data(), {static_cast<int64_t>(out.size())}, DType::Float64, nullptr);
  backend.allGather(tin, tout, false)->wait();
  return out;
}

}  // namespace cyxwiz::comm
