// Gradient checkpointing for SequentialModel (the contract is in sequential.h).
//
// Forward, in training mode:            for each segment: remember its input and the random stream's
//                                       state, run its layers, and (all but the last) drop their caches.
// Backward, segments last to first:     re-run the segment's forward from its input with the random
//                                       stream put back where the first forward found it (the last
//                                       segment still has its caches), then the usual per-layer
//                                       backward, then drop the segment's caches.
// Each layer's backward still reports its gradients as it finishes (Module::gradsReady), so
// DistributedDataParallel's buckets still start their all-reduce while earlier layers compute.
#include <algorithm>

#include "cyxwiz/common/error.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/sequential.h"
#include "cyxwiz/tensor/random.h"

namespace cyxwiz::nn {

namespace {

// Puts the global generator back to `state` on scope exit, also when a layer throws.
class RestoreGenerator {
 public:
  explicit RestoreGenerator(const std::mt19937_64& state) : state_(state) {}
  ~RestoreGenerator() { globalGenerator() = state_; }
  RestoreGenerator(const RestoreGenerator&) = delete;
  RestoreGenerator& operator=(const RestoreGenerator&) = delete;

 private:
  std::mt19937_64 state_;
};

}  // namespace

void SequentialModel::setGradientCheckpointing(int segments) {
  CYX_CHECK(segments >= 0, "SequentialModel.set_gradient_checkpointing(", segments,
            "): segments must be 0 (off) or a positive number of segments");
  checkpointSegments_ = segments;  // the last forward's segments (if any) still serve its backward
}

std::vector<std::pair<size_t, size_t>> SequentialModel::segmentBounds() const {
  // Units: a fused LinearModule + ReLUModule pair, or one layer.
  std::vector<size_t> unitBegin;
  for (size_t i = 0; i < modules_.size(); i += fusedAt(i) ? 2 : 1) unitBegin.push_back(i);
  const size_t units = unitBegin.size();
  const size_t k = std::min(static_cast<size_t>(checkpointSegments_), units);
  // Segment j takes units [j*units/k, (j+1)*units/k): sizes differ by at most one.
  std::vector<std::pair<size_t, size_t>> bounds;
  for (size_t j = 0; j < k; ++j) {
    const size_t first = j * units / k, last = (j + 1) * units / k;
    bounds.emplace_back(unitBegin[first], last < units ? unitBegin[last] : modules_.size());
  }
  return bounds;
}

Tensor SequentialModel::forwardCheckpointed(const Tensor& input) {
  const std::vector<std::pair<size_t, size_t>> bounds = segmentBounds();
  Tensor x = input.to(device_);
  // Kept until backward: never the caller's array (Module's contract). The first layer then keeps
  // this copy too, instead of copying again.
  if (x.borrowed()) x = x.clone();
  try {
    for (size_t j = 0; j < bounds.size(); ++j) {
      Segment s;
      s.begin = bounds[j].first;
      s.end = bounds[j].second;
      s.input = x;
      s.random = globalGenerator();
      s.autocast = autocastState();
      x = runLayers(s.begin, s.end, x);
      // The last segment's caches are what backward needs first: kept (as torch keeps them).
      s.cached = j + 1 == bounds.size();
      if (!s.cached) {
        for (size_t i = s.begin; i < s.end; ++i) modules_[i]->releaseCache();
      }
      segments_.push_back(std::move(s));
    }
  } catch (...) {
    segments_.clear();  // half a forward: backward then says forward has not run
    throw;
  }
  return x;
}

void SequentialModel::recompute(Segment& s, const Tensor* nextInput) {
  // Backward usually runs outside autocast: the replay computes (and keeps) what the forward did.
  AutocastGuard autocast(s.autocast);
  // The forward that made the segment's input ran in training mode; so does its replay (a model
  // switched to eval() between forward and backward would otherwise replay Dropout as the identity).
  for (size_t i = s.begin; i < s.end; ++i) modules_[i]->setTraining(true);
  {
    // Dropout draws the very masks of the first forward; afterwards the stream is where it was, so a
    // checkpointed step draws exactly what a plain one does and the next step's masks are unchanged.
    RestoreGenerator restore(globalGenerator());
    globalGenerator() = s.random;
    // The replay must not count its batch twice in BatchNorm's running statistics: they are put back.
    std::vector<std::pair<Buffer*, Tensor>> buffers;
    for (size_t i = s.begin; i < s.end; ++i) {
      for (Buffer* b : modules_[i]->buffers()) buffers.emplace_back(b, b->value.clone());
    }
    runLayers(s.begin, s.end, s.input);  // the output equals the next segment's input: not needed
    for (auto& [buffer, saved] : buffers) buffer->value.copyFrom(saved);
  }
  // A fused ReLU closing the segment keeps its output as its cache: the next segment's input, bit for
  // bit. Keeping that one instead frees the copy, one activation less for the rest of backward.
  if (nextInput && s.end - s.begin >= 2 && fusedAt(s.end - 2)) {
    static_cast<ReLUModule*>(modules_[s.end - 1].get())->keepOutputAsInput(*nextInput);
  }
  for (size_t i = s.begin; i < s.end; ++i) modules_[i]->setTraining(training_);
  s.cached = true;
}

Tensor SequentialModel::backwardCheckpointed(const Tensor& gradOutput, bool needInputGrad) {
  Tensor g = gradOutput.to(device_);
  for (size_t j = segments_.size(); j-- > 0;) {
    Segment& s = segments_[j];
    if (!s.cached) recompute(s, j + 1 < segments_.size() ? &segments_[j + 1].input : nullptr);
    for (size_t i = s.end; i-- > s.begin;) {
      modules_[i]->setNeedInputGrad(i > 0 || needInputGrad);
      g = modules_[i]->backward(g);
    }
    // Its inputs stay, so that another backward (without a forward, as a plain model allows) replays it.
    for (size_t i = s.begin; i < s.end; ++i) modules_[i]->releaseCache();
    s.cached = false;
  }
  return g;
}

}  // namespace cyxwiz::nn
