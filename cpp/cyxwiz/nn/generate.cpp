#include "cyxwiz/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/positional.h"

namespace cyxwiz::nn {

namespace {

// The longest context the model takes: its positional encoding's max_len, or no limit.
int64_t contextOf(const SequentialModel& model) {
  for (const auto& m : model.modules()) {
    if (auto* p = dynamic_cast<const PositionalEncodingModule*>(m.get())) return p->maxLen();
  }
  return INT64_MAX;
}

// One id drawn from `logits` (V values).
int64_t draw(const float* logits, int64_t V, double temperature, std::optional<int64_t> topK, std::mt19937_64& gen) {
  if (temperature == 0.0) return std::max_element(logits, logits + V) - logits;
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  const int64_t k = topK ? std::min(*topK, V) : V;
  // The k largest first (ties by id: the same draw on every platform).
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  const double top = logits[order[0]];
  std::vector<double> weight(static_cast<size_t>(k));
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i) total += weight[static_cast<size_t>(i)] = std::exp((logits[order[static_cast<size_t>(i)]] - top) / temperature);
  // Inverse CDF with the engine's portable uniform draw (std::discrete_distribution differs by platform).
  const double u = static_cast<double>(gen() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    acc += weight[static_cast<size_t>(i)];
    if (u < acc) return order[static_cast<size_t>(i)];
  }
  return order[static_cast<size_t>(k - 1)];
}

// Every layer can decode (Module::canDecode) and the model is on the CPU.
bool decodable(const SequentialModel& model) {
  if (model.device().type != DeviceType::CPU) return false;
  for (const auto& m : model.modules()) {
    if (!m->canDecode()) return false;
  }
  return true;
}

// ids[:, begin:end) of (N, total) ids.
Tensor columns(const int64_t* ids, int64_t N, int64_t total, int64_t begin, int64_t end) {
  Tensor out = Tensor::empty({N, end - begin}, DType::Int64);
  for (int64_t n = 0; n < N; ++n) std::memcpy(out.data<int64_t>() + n * (end - begin), ids + n * total + begin, (end - begin) * sizeof(int64_t));
  return out;
}

// The model's decode of tokens at positions [position, ...): logits (N, T, vocab).
Tensor decodeModel(SequentialModel& model, Tensor x, int64_t position) {
  for (const auto& m : model.modules()) x = m->decode(x, position);
  return x;
}

void resetDecoding(SequentialModel& model) {
  for (const auto& m : model.modules()) m->resetDecoding();
}

}  // namespace

Tensor generate(SequentialModel& model, const Tensor& prompt, int64_t maxNewTokens, double temperature,
                std::optional<int64_t> topK, uint64_t seed, bool useCache) {
  CYX_CHECK(prompt.dtype() == DType::Int64 && (prompt.dim() == 1 || prompt.dim() == 2) && prompt.numel() > 0,
            "generate: prompt_ids must be integer token ids of shape (T,) or (N, T) with T >= 1, got ",
            dtypeName(prompt.dtype()), " ", shapeString(prompt.shape()));
  if (prompt.dim() == 1) {  // one sequence: (T,) in, (T + max_new_tokens,) out
    const Tensor ids = generate(model, prompt.reshape({1, prompt.size(0)}), maxNewTokens, temperature, topK, seed, useCache);
    return ids.reshape({ids.size(1)});
  }
  CYX_CHECK(maxNewTokens >= 0, "generate: max_new_tokens=", maxNewTokens, " must be 0 or more");
  CYX_CHECK(temperature >= 0.0 && std::isfinite(temperature), "generate: temperature=", temperature,
            " must be 0 (argmax) or positive");
  CYX_CHECK(!topK || *topK > 0, "generate: top_k=", topK.value_or(0), " must be positive (or None)");
  const int64_t N = prompt.size(0), T0 = prompt.size(1), total = T0 + maxNewTokens;
  const int64_t context = contextOf(model);
  Tensor ids = Tensor::empty({N, total}, DType::Int64);
  int64_t* out = ids.data<int64_t>();
  const Tensor host = prompt.to(Device{});
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * total, host.data<int64_t>() + n * T0, T0 * sizeof(int64_t));
  const bool wasTraining = model.training();
  model.eval();
  std::mt19937_64 gen(seed);
  const bool cached = useCache && decodable(model);
  if (cached) resetDecoding(model);
  int64_t kept = 0;  // positions the layers' caches hold (cached only)
  try {
    for (int64_t t = T0; t < total; ++t) {
      const int64_t len = std::min(t, context), first = t - len;
      Tensor logits;
      if (!cached) {
        logits = model.forward(columns(out, N, total, first, t)).to(Device{});
      } else if (first == 0 && kept > 0) {  // one new token, after those the caches hold
        logits = decodeModel(model, columns(out, N, total, t - 1, t), kept);
        kept = t;
      } else {
        // The prompt, or a window that slid (every position moved: what the caches hold is stale).
        resetDecoding(model);
        logits = decodeModel(model, columns(out, N, total, first, t), 0);
        kept = len;
      }
      const int64_t rows = logits.dim() == 3 ? logits.size(1) : 0;
      CYX_CHECK(logits.dim() == 3 && logits.size(0) == N && rows > 0, "generate: the model must map ids (N, T) "
                "to logits (N, T, vocab), got ", shapeString(logits.shape()));
      const int64_t V = logits.size(2);
      for (int64_t n = 0; n < N; ++n) {
        out[n * total + t] = draw(logits.data<float>() + (n * rows + rows - 1) * V, V, temperature, topK, gen);
      }
    }
  } catch (...) {
    if (cached) resetDecoding(model);
    if (wasTraining) model.train();
    throw;
  }
  if (cached) resetDecoding(model);  // the keys and values go with the call
  if (wasTraining) model.train();
  return ids;
}

}  // namespace cyxwiz::nn
