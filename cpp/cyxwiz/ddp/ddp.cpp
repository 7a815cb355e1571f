#include "cyxwiz/ddp/ddp.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/exchange.h"
#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/common/env.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/ddp/sync_batchnorm.h"
#include "cyxwiz/ddp/wire.h"
#include "cyxwiz/tensor/host_cache.h"

namespace cyxwiz::ddp {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr size_t kFirstBucketCap = 1 << 20;  // PyTorch DDP's first bucket: start communicating early
// The fused step pays from here (unless CYXWIZ_DDP_FUSED_STEP=1 forces it): on the 2-core EPYC the
// 784-256-10 model's one 814 KB bucket stepped 4..8% slower fused than unfused in each of 4 runs, and
// buckets of 1..7 MB (784-512-512-10, 784-1024-1024-10) took the same time either way.
constexpr size_t kFusedStepMinBytes = size_t{1} << 20;

double checksum(const Tensor& t) {
  const Tensor host = t.to(Device{});
  double s = 0.0;
  if (host.dtype() == DType::Int64) {  // num_batches_tracked
    for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(host.data<int64_t>()[i]);
    return s;
  }
  const float* x = host.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) s += x[i];
  return s;
}

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// How a bucket exchanged as `wire` is reduced: the average, except float16, which tops out at 65504:
// summing N full-size gradients could overflow where their mean would not, so each rank's are
// divided by N before rounding and summed.
std::pair<comm::ReduceOp, float> wireReduction(DType wire, int worldSize) {
  if (wire == DType::Float16) return {comm::ReduceOp::Sum, 1.0f / static_cast<float>(worldSize)};
  return {comm::ReduceOp::Avg, 1.0f};
}

bool overlapPolicy(const comm::DistributedConfig& config, bool onGpu) {
  // A GPU backend (NCCL) runs on its own stream and costs the host only a launch: always overlap.
  const long cores = static_cast<long>(std::thread::hardware_concurrency());
  return envFlag("CYXWIZ_DDP_OVERLAP", onGpu || 2L * comm::ranksOnThisHost(config) <= cores);
}

}  // namespace

std::string describeSharedSettings(const DDPConfig& config) {
  return makeString("gradient_dtype=", dtypeName(config.gradientDtype),
                    " shard_optimizer=", config.shardOptimizer ? "True" : "False",
                    " broadcast_buffers=", config.broadcastBuffers ? "True" : "False");
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::SequentialModel> model, const DDPConfig& config)
    : model_(std::move(model)), config_(config) {
  // The model's gradients (and, sharded, its parameters) move into the buckets: the blocks they leave go
  // back to the system at once, not into the host cache (no step asks for them again; kept, they would
  // raise the sharded step's peak resident size by the model's size).
  const host_cache::ReleaseDirectly moving;
  CYX_CHECK(model_ != nullptr, "DistributedDataParallel: model is None");
  CYX_CHECK(config.bucketSizeMb > 0, "DDPConfig.bucket_size_mb=", config.bucketSizeMb, " must be positive");
  backend_ = comm::backend("DistributedDataParallel");
  config_.checkGradients = config.checkGradients || envFlag("CYXWIZ_DDP_CHECK_GRADIENTS", false);
  if (config.findUnusedParameters) {
    logNotice("DDPConfig.find_unused_parameters=True has no effect: every layer of a SequentialModel receives a "
            "gradient in every backward");
  }
  fingerprint_ = model_->architectureFingerprint();
  moduleCount_ = model_->size();
  const std::optional<Device> gpu = backend_->device();
  if (gpu && model_->device() != *gpu) {
    CYX_CHECK(model_->device().type == DeviceType::CPU, "DistributedDataParallel: the model is on ",
              model_->device().str(), " but this rank's NCCL communicator drives ", gpu->str(),
              " (LOCAL_RANK); leave the model on the CPU and DDP moves it, or move it to ", gpu->str());
    model_->to(*gpu);  // the guide's scripts never move the model themselves
    logInfo(makeString("DistributedDataParallel: model moved to ", gpu->str(), " for the ", backend_->name(),
                       " backend"));
  }
  config_.shardOptimizer = config.shardOptimizer || envFlag("CYXWIZ_DDP_SHARD_OPTIMIZER", false);
  CYX_CHECK(!config_.shardOptimizer || !gpu, rankPrefix(), "DistributedDataParallel: shard_optimizer=True runs with the "
            "CPU backend only in this version; leave it off with ", backend_->name());
  const DType wire = config_.gradientDtype;
  CYX_CHECK(wire == DType::Float32 || wire == DType::BFloat16 || wire == DType::Float16, rankPrefix(),
            "DDPConfig.gradient_dtype=", dtypeName(wire), ": gradients travel in 'float32' (default), 'bfloat16' or "
            "'float16'");
  overlap_ = overlapPolicy(backend_->config(), gpu.has_value());
  // Only where nothing overlaps: with overlap the buckets are reduced during backward.
  fusedStep_ = envFlag("CYXWIZ_DDP_FUSED_STEP", !overlap_) && !gpu && worldSize() > 1;
  const std::optional<std::string> fusedSetting = envString("CYXWIZ_DDP_FUSED_STEP");
  fusedForced_ = fusedStep_ && fusedSetting && !fusedSetting->empty();
  if (worldSize() > 1) {
    checkSameArchitecture();
    if (config.broadcastParameters) {
      broadcastParameters();
      broadcastBuffers();  // torch syncs the whole module state at construction
    }
  }
  installSyncBatchNorm();  // a SyncBatchNorm layer reduces its statistics over this job
  const size_t cap = static_cast<size_t>(config.bucketSizeMb * kMiB);
  // On the CPU the buckets may live in memory the other ranks of the host map: all_reduce then reads
  // them where they lie. Every rank makes the same buckets in the same order (same architecture).
  const Device device = model_->device();
  const bool shared = device.type == DeviceType::CPU && worldSize() > 1;
  buckets_ = std::make_unique<GradientBuckets>(
      *model_, std::max<size_t>(cap, 1), std::min(cap, kFirstBucketCap), [&](int64_t elements) {
        return shared ? backend_->sharedZeros(elements, DType::Float32) : Tensor::zeros({elements}, DType::Float32, device);
      });
  if (wire != DType::Float32 && worldSize() > 1) {
    // Beside the buckets: host (shared) memory on the CPU, the model's GPU otherwise, where the
    // conversions run as kernels on the compute stream and NCCL reduces the 16-bit copy.
    for (Bucket& b : buckets_->buckets()) {
      b.wireDtype = wire;
      // One host, a large shared bucket: the peers' float32 buckets are read where they lie and rounded
      // as they are read, so no 16-bit copy (and no narrowing and widening passes) is needed.
      if (backend_->reducesRounded(b.storage)) continue;
      const int64_t n = b.storage.numel();
      b.wire = shared ? backend_->sharedZeros(n, wire) : Tensor::zeros({n}, wire, device);
    }
  }
  if (config_.shardOptimizer && worldSize() > 1) shardParameters();
  for (const auto& m : model_->modules()) {
    m->setGradReadyHook([this](nn::Module& module) { onGradsReady(module); });
  }
  model_->setGradientGuard([this](nn::SequentialModel::GradientUse use) { guardGradients(use); });
  if (worldSize() > 1) {
    size_t rounded = 0;
    size_t fused = 0;
    for (const Bucket& b : buckets_->buckets()) {
      rounded += b.wireDtype != DType::Float32 && !b.wire.defined();
      fused += fusible(b);
    }
    logInfo(makeString("DistributedDataParallel: ", buckets_->buckets().size(), " gradient buckets; ",
                       shard_.empty() ? "all-reduce " : "sharded optimizer step, reduce-scatter ",
                       wire == DType::Float32 ? "" : makeString("in ", dtypeName(wire), " "),
                       rounded ? makeString("(", rounded, " rounded as the peers' float32 buckets are read) ") : "",
                       overlap_ ? "overlapped with backward" : "at sync time (fewer than 2 cores per local rank)",
                       fused ? makeString(", the optimizer step reading ", fused, " of them as they are reduced") : "",
                       model_->device().type == DeviceType::CUDA ? makeString(", on ", model_->device().str()) : ""));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (const auto& m : model_->modules()) m->setGradReadyHook(nullptr);
  model_->setGradientGuard(nullptr);
  try {
    waitAll();  // the communication thread must not write into buckets after they are gone
  } catch (...) {
  }
}

void DistributedDataParallel::checkSameArchitecture() {
  // What every rank sends: "<fingerprint>\n<settings>\n<layer summary>".
  std::string summary;
  for (const auto& m : model_->modules()) summary += (summary.empty() ? "" : " -> ") + m->repr();
  const std::string settings = describeSharedSettings(config_);
  std::vector<std::string> all = comm::allGatherStrings(*backend_, fingerprint_ + "\n" + settings + "\n" + summary);
  auto field = [&](size_t r, int k) {  // k: 0 fingerprint, 1 settings, 2 summary
    size_t begin = 0;
    for (int i = 0; i < k; ++i) begin = all[r].find('\n', begin) + 1;
    return k == 2 ? all[r].substr(begin) : all[r].substr(begin, all[r].find('\n', begin) - begin);
  };
  bool sameModel = true, sameSettings = true;
  for (size_t r = 0; r < all.size(); ++r) {
    sameModel = sameModel && field(r, 0) == fingerprint_;
    sameSettings = sameSettings && field(r, 1) == settings;
  }
  if (sameModel && sameSettings) return;
  const int k = sameModel ? 1 : 2;
  std::string message = sameModel
      ? makeString(rankPrefix(), "DistributedDataParallel: the DDP settings differ across ranks; every rank must "
                   "wrap its model with the same DDPConfig (gradient_dtype, shard_optimizer and their environment "
                   "variables):")
      : makeString(rankPrefix(), "DistributedDataParallel: the model differs across ranks; every rank must build the "
                   "same architecture (same layers, sizes and order):");
  for (size_t r = 0; r < all.size(); ++r) {
    const bool differs = field(r, k == 1 ? 1 : 0) != field(0, k == 1 ? 1 : 0);
    message += makeString("\n  rank ", r, differs ? " (differs from rank 0)" : "", ": ", field(r, k));
  }
  throw DistError(message);
}

void DistributedDataParallel::broadcastParameters() {
  std::vector<nn::Parameter*> params = model_->parameters();
  Tensor flat = Tensor::empty({model_->numParameters()}, DType::Float32, model_->device());
  int64_t offset = 0;
  for (nn::Parameter* p : params) {
    flat.view(offset, p->value.shape()).copyFrom(p->value);
    offset += p->value.numel();
  }
  backend_->broadcast(flat, 0, false)->wait();
  offset = 0;
  for (nn::Parameter* p : params) {
    p->value.copyFrom(flat.view(offset, p->value.shape()));
    offset += p->value.numel();
  }
}

void DistributedDataParallel::broadcastBuffers() {
  // Float32 statistics and int64 counters travel together as float64, exact for both (counts < 2^53).
  const std::vector<nn::Buffer*> buffers = model_->buffers();
  if (buffers.empty() || worldSize() == 1) return;
  if (model_->device().type == DeviceType::CUDA && backend_->device()) {
    // NCCL: on the device, one broadcast a buffer, all queued before the first wait: no host round trip
    // (and capturable in a graphed step).
    std::vector<std::shared_ptr<comm::Work>> works;
    for (nn::Buffer* b : buffers) works.push_back(backend_->broadcast(b->value, 0, true));
    for (const auto& w : works) w->wait();
    return;
  }
  int64_t total = 0;
  for (nn::Buffer* b : buffers) total += b->value.numel();
  Tensor flat = Tensor::empty({total}, DType::Float64);
  double* f = flat.data<double>();
  for (nn::Buffer* b : buffers) {
    const Tensor host = b->value.to(Device{});
    for (int64_t i = 0; i < host.numel(); ++i) {
      *f++ = host.dtype() == DType::Int64 ? static_cast<double>(host.data<int64_t>()[i]) : host.data<float>()[i];
    }
  }
  backend_->broadcast(flat, 0, false)->wait();
  f = flat.data<double>();
  for (nn::Buffer* b : buffers) {
    Tensor host = Tensor::empty(b->value.shape(), b->value.dtype());
    for (int64_t i = 0; i < host.numel(); ++i, ++f) {
      if (host.dtype() == DType::Int64) {
        host.data<int64_t>()[i] = static_cast<int64_t>(*f);
      } else {
        host.data<float>()[i] = static_cast<float>(*f);
      }
    }
    b->value.copyFrom(host);
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  checkModelUnchanged("forward");
  // As torch's DDP: rank 0's buffers (BatchNorm's running statistics) before each training forward.
  if (config_.broadcastBuffers && model_->training()) broadcastBuffers();
  return model_->forward(input);
}

Tensor DistributedDataParallel::backward(const Tensor& gradOutput, bool needInputGrad) {
  checkModelUnchanged("backward");
  // The last backward's all-reduces write into the buckets this one adds to. A reduce-scattered
  // bucket (sharded step, no update since) holds the average in this rank's part only: made whole
  // first, adding to it and reducing again averages the sum, as with an all-reduce.
  completeGradients();
  const bool reduce = requireSync_ && worldSize() > 1 && overlap_;
  auto& buckets = buckets_->buckets();
  for (Bucket& b : buckets) b.pending = b.layers;
  inBackward_ = reduce;
  Tensor gradInput;
  try {
    gradInput = model_->backward(gradOutput, needInputGrad);
  } catch (...) {
    inBackward_ = false;
    throw;
  }
  inBackward_ = false;
  for (Bucket& b : buckets) {
    if (!reduce) {
      b.stale = worldSize() > 1;
    } else if (!b.work) {
      launch(b);  // a layer that did not report its gradients: reduce its bucket now
    }
  }
  return gradInput;
}

void DistributedDataParallel::onGradsReady(const nn::Module& module) {
  if (!inBackward_) return;
  for (size_t index : buckets_->bucketsOf(&module)) {
    Bucket& b = buckets_->buckets()[index];
    if (--b.pending == 0) launch(b);
  }
}

void DistributedDataParallel::shardParameters() {
  std::vector<nn::Parameter*> params = model_->parameters();
  shard_.assign(params.size(), {0, 0});
  for (Bucket& b : buckets_->buckets()) {
    const int64_t elements = b.storage.numel();
    b.values = backend_->sharedZeros(elements, DType::Float32);
    // This rank's part of the bucket, as reduceScatterInPlace leaves it averaged here.
    const auto first = static_cast<int64_t>(comm::partBegin(static_cast<size_t>(elements), worldSize(), rank()));
    const auto last = static_cast<int64_t>(comm::partBegin(static_cast<size_t>(elements), worldSize(), rank() + 1));
    int64_t offset = 0;
    for (size_t i : b.params) {
      nn::Parameter& p = *params[i];
      const int64_t numel = p.value.numel();
      Tensor view = b.values.view(offset, p.value.shape());
      view.copyFrom(p.value);
      p.value = view;
      shard_[i] = {std::clamp<int64_t>(first - offset, 0, numel), std::clamp<int64_t>(last - offset, 0, numel)};
      offset += numel;
    }
  }
}

void DistributedDataParallel::launch(Bucket& bucket) {
  const Tensor* data = &bucket.storage;
  auto [op, scale] = wireReduction(bucket.wireDtype, worldSize());
  if (bucket.wireDtype != DType::Float32) {
    if (!bucket.wire.defined()) {  // rounded as the peers' buckets are read (the constructor's choice)
      bucket.work = backend_->allReduceRounded(bucket.storage, bucket.wireDtype, scale, op, !shard_.empty(), overlap_);
      bucket.partial = !shard_.empty();
      bucket.stale = false;
      return;
    }
    narrowGradients(bucket.storage, bucket.wire, scale);
    data = &bucket.wire;
    bucket.onWire = true;
  }
  if (shard_.empty()) {
    bucket.work = backend_->allReduce(*data, op, overlap_);
  } else {
    bucket.work = backend_->reduceScatterInPlace(*data, op, overlap_);
    bucket.partial = true;
  }
  bucket.stale = false;
}

void DistributedDataParallel::finish(Bucket& bucket) {
  if (!bucket.work) return;
  std::exchange(bucket.work, nullptr)->wait();
  if (!std::exchange(bucket.onWire, false)) return;
  const auto elements = static_cast<size_t>(bucket.storage.numel());
  const bool part = bucket.partial;  // reduce-scattered: only this rank's part is reduced
  const auto first = part ? static_cast<int64_t>(comm::partBegin(elements, worldSize(), rank())) : 0;
  const auto last = part ? static_cast<int64_t>(comm::partBegin(elements, worldSize(), rank() + 1))
                         : static_cast<int64_t>(elements);
  widenGradients(bucket.wire, bucket.storage, first, last);
}

void DistributedDataParallel::completeGradients() {
  waitAll();
  for (Bucket& b : buckets_->buckets()) {
    if (b.partial) backend_->allGatherInPlace(b.storage, false)->wait();
    b.partial = false;
  }
}

void DistributedDataParallel::launchStale(bool exceptFusible) {
  for (Bucket& b : buckets_->buckets()) {
    if (b.stale && !(exceptFusible && fusible(b))) launch(b);
  }
}

bool DistributedDataParallel::fusible(const Bucket& bucket) const {
  // Reading N buckets whole costs more than an all-reduce's passes beyond two ranks for the plain step
  // (see ddp.h); a sharded step reads only its part, so it gains at any size.
  // A 16-bit bucket qualifies where it is rounded as the peers' buckets are read (no 16-bit copy). Rounding
  // is compute-bound, so the plain step's reduction rounds each rank's part once, as the all-reduce does,
  // and reads the peer's part where it lies (WindowCollectives::reduceForStep); rounding every element on
  // every rank measured slower (2 ranks, 784-4096-4096-10 on the 2-core Xeon: 153.5 ms against 150.0
  // all-reduced; sharded 136.7 against 139.1, 131.5 against 135.0).
  const bool wire = bucket.wireDtype == DType::Float32 || !bucket.wire.defined();
  return fusedStep_ && wire && (!shard_.empty() || worldSize() <= 2) &&
         (fusedForced_ || bucket.storage.nbytes() >= kFusedStepMinBytes) && backend_->reducesForStep(bucket.storage);
}

void DistributedDataParallel::stepFromPeers(Bucket& bucket, nn::Optimizer& optimizer,
                                            const std::vector<nn::Parameter*>& params) {
  // Where each parameter starts in the bucket; a piece [first, last) of the reduction updates the
  // parameters it overlaps.
  std::vector<int64_t> starts{0};
  for (size_t i : bucket.params) starts.push_back(starts.back() + params[i]->value.numel());
  size_t k = 0;  // the first parameter the next piece may overlap: pieces come in order within a rank's part
  const auto [op, scale] = wireReduction(bucket.wireDtype, worldSize());
  backend_->reduceForStep(bucket.storage, op, !shard_.empty(), bucket.wireDtype, scale,
                          [&](size_t first, size_t last, const float* reduced) {
                            const auto lo = static_cast<int64_t>(first), hi = static_cast<int64_t>(last);
                            if (lo < starts[k]) k = 0;  // the next rank's part, before this one's
                            while (k + 1 < starts.size() && starts[k + 1] <= lo) ++k;
                            for (size_t j = k; j < bucket.params.size() && starts[j] < hi; ++j) {
                              const int64_t from = std::max(lo, starts[j]), to = std::min(hi, starts[j + 1]);
                              optimizer.updateRange(bucket.params[j], params, from - starts[j], to - starts[j],
                                                    reduced + (from - lo));
                            }
                          });
  bucket.stale = false;
}

void DistributedDataParallel::waitAll() {
  for (Bucket& b : buckets_->buckets()) finish(b);
}

void DistributedDataParallel::guardGradients(nn::SequentialModel::GradientUse use) {
  using Use = nn::SequentialModel::GradientUse;
  waitAll();  // the communication thread writes into the buckets until then
  if (use == Use::Clear) {
    for (Bucket& b : buckets_->buckets()) b.stale = b.partial = false;  // nothing local is left to average
  }
  if (use != Use::Step) return;
  for (const Bucket& b : buckets_->buckets()) {
    if (b.stale || b.partial) {
      throw InvalidArgument(makeString(
          rankPrefix(), "optimizer.step(model): this model's gradients are not averaged across ranks yet (it is "
          "wrapped in DistributedDataParallel); call ddp.update_parameters(optimizer), or ddp.sync_gradients() "
          "before optimizer.step(model)"));
    }
  }
}

void DistributedDataParallel::syncGradients() {
  checkModelUnchanged("sync_gradients");
  launchStale(false);
  completeGradients();  // waits for them all first
}

void DistributedDataParallel::updateParameters(nn::Optimizer& optimizer) {
  checkModelUnchanged("update_parameters");
  std::vector<nn::Parameter*> params = model_->parameters();
  const bool fuse = !config_.checkGradients;  // check_gradients compares the averaged gradients first
  launchStale(fuse);
  if (config_.checkGradients && worldSize() > 1) {
    completeGradients();
    compareAcrossRanks();
  }
  if (!shard_.empty()) optimizer.setShard(shard_);
  optimizer.beginStep(params);
  for (Bucket& b : buckets_->buckets()) {
    if (fuse && b.stale && fusible(b)) {
      stepFromPeers(b, optimizer, params);
    } else {
      finish(b);
      optimizer.updateParameters(b.params, params);  // one fused launch per bucket on a GPU
    }
    b.storage.fill(0.0);  // sharded: the reduce-scatter's end means no peer reads it any more
    if (!shard_.empty()) {
      b.partial = false;
      b.work = backend_->allGatherInPlace(b.values, overlap_);  // every rank's updated part to all
    }
  }
  if (!shard_.empty()) waitAll();  // the next forward reads the parameters
}

nn::OptimizerState DistributedDataParallel::optimizerState(const nn::Optimizer& optimizer) {
  if (shard_.empty()) return optimizer.state();
  std::vector<nn::Parameter*> params = model_->parameters();
  return optimizer.state([&](const std::vector<Tensor>& parts) {
    CYX_CHECK(parts.size() == params.size(), rankPrefix(), "optimizer_state_dict: the optimizer holds state for ",
              parts.size(), " parameters and this model has ", params.size(), "; use one optimizer per model");
    // Each bucket's shards, put where they lie in the bucket, all-gathered as the parameters are.
    std::vector<Tensor> whole(parts.size());
    for (const Bucket& b : buckets_->buckets()) {
      Tensor flat = Tensor::zeros({b.storage.numel()}, DType::Float32, b.storage.device());
      int64_t offset = 0;
      for (size_t i : b.params) {
        const auto [first, last] = shard_[i];
        if (last > first) flat.view(offset + first, {last - first}).copyFrom(parts[i]);
        offset += params[i]->value.numel();
      }
      backend_->allGatherInPlace(flat, false)->wait();
      offset = 0;
      for (size_t i : b.params) {
        whole[i] = flat.view(offset, params[i]->value.shape()).clone();
        offset += params[i]->value.numel();
      }
    }
    return whole;
  });
}

void DistributedDataParallel::discardCapturedWork() {
  for (Bucket& b : buckets_->buckets()) {
    b.work = nullptr;
    b.stale = b.onWire = false;
  }
}

void DistributedDataParallel::zeroGrad() {
  waitAll();
  for (Bucket& b : buckets_->buckets()) {
    b.storage.fill(0.0);
    b.stale = b.partial = false;
  }
}

std::vector<std::pair<int64_t, int64_t>> DistributedDataParallel::bucketSizes() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Bucket& b : buckets_->buckets()) {
    out.emplace_back(static_cast<int64_t>(b.params.size()), static_cast<int64_t>(b.storage.nbytes()));
  }
  return out;
}

void DistributedDataParallel::checkModelUnchanged(const char* operation) const {
  if (model_->size() != moduleCount_ || model_->parameters().size() != buckets_->parameterCount()) {
    throw InvalidArgument(makeString(rankPrefix(), "DistributedDataParallel.", operation, ": the model changed after it was wrapped "
                                     "(layers added?); build the whole model first, then wrap it"));
  }
  if (shard_.empty()) return;
  // A sharded step writes the parameters into the buckets' `values`: they must still live there.
  std::vector<nn::Parameter*> params = model_->parameters();
  for (const Bucket& b : buckets_->buckets()) {
    const auto* at = static_cast<const uint8_t*>(b.values.rawData());
    for (size_t i : b.params) {
      if (params[i]->value.rawData() != at) {
        throw InvalidArgument(makeString(rankPrefix(), "DistributedDataParallel.", operation, ": a parameter was moved or "
                                         "replaced after the model was wrapped with shard_optimizer=True; move the model "
                                         "(model.to) before wrapping it"));
      }
      at += params[i]->value.nbytes();
    }
  }
}

std::vector<std::string> DistributedDataParallel::parameterNames() const {
  std::vector<std::string> names;
  for (auto& [name, p] : model_->namedParameters()) names.push_back(name);
  return names;
}

void DistributedDataParallel::compareAcrossRanks() {
  std::vector<nn::Parameter*> params = model_->parameters();
  const size_t n = params.size();
  std::vector<double> mine;
  for (nn::Parameter* p : params) mine.push_back(checksum(p->grad));
  for (nn::Parameter* p : params) mine.push_back(checksum(p->value));
  const auto buffers = model_->namedBuffers();
  for (auto& [name, b] : buffers) mine.push_back(checksum(b->value));
  std::vector<double> all = comm::allGatherDoubles(*backend_, mine);
  std::vector<std::string> names = parameterNames();
  const size_t stride = mine.size();
  for (size_t k = 0; k < stride; ++k) {
    // k: gradients [0, n), parameters [n, 2n), buffers after.
    const int kind = k < n ? 0 : k < 2 * n ? 1 : 2;
    const std::string& name = kind < 2 ? names[k % n] : buffers[k - 2 * n].first;
    for (int r = 1; r < worldSize(); ++r) {
      double here = all[r * stride + k], first = all[k];
      if (sameBits(here, first)) continue;
      std::string key = std::string(kind == 0 ? "g:" : kind == 1 ? "p:" : "b:") + name;
      if (warned_.insert(key).second) {
        static const char* what[] = {"Gradients differ across ranks", "Parameters differ across ranks",
                                     "Buffers differ across ranks"};
        static const char* remedy[] = {
            ". The replicas will drift apart. Change gradients (clipping, scaling) identically on every rank, "
            "and between backward and update_parameters only through DDP",
            ". Keep DDPConfig.broadcast_parameters=True, build the same model on every rank and seed every "
            "rank alike (cx.manual_seed)",
            ". Each rank's BatchNorm keeps statistics of its own rows: keep DDPConfig.broadcast_buffers=True (rank 0's "
            "are sent before each forward) or cx.distributed.convert_sync_batchnorm(model)"};
        logWarning(makeString(what[kind], ": ", kind == 2 ? "buffer " : "parameter ", name, " has checksum ", first,
                              " on rank 0 but ", here, " on rank ", r, remedy[kind]));
      }
      break;
    }
  }
}

}  // namespace cyxwiz::ddp
