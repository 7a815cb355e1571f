// Data-parallel training from C++: every process runs this program as one rank of the job.
//
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./ddp_example &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./ddp_example
//
// Without RANK/WORLD_SIZE it is a world of one. See README.md.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>

#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/nn/adam.h"
#include "cyxwiz/nn/cross_entropy.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/sequential.h"
#include "cyxwiz/tensor/random.h"

using cyxwiz::Tensor;
namespace comm = cyxwiz::comm;
namespace nn = cyxwiz::nn;

constexpr int64_t kFeatures = 16, kClasses = 4, kBatch = 32;  // kBatch rows per rank and step

// A synthetic problem: the class of a row is the largest of its first kClasses features. Each rank
// draws its own rows (seeded by rank and step), as if it read its own shard of a data set.
void makeBatch(int rank, int step, Tensor& x, Tensor& y) {
  std::mt19937_64 gen(1000003ull * static_cast<uint64_t>(rank) + static_cast<uint64_t>(step));
  for (int64_t r = 0; r < kBatch; ++r) {
    int64_t label = 0;
    for (int64_t c = 0; c < kFeatures; ++c) {
      const float v = cyxwiz::uniform01(gen) * 2.0f - 1.0f;
      x.data<float>()[r * kFeatures + c] = v;
      if (c < kClasses && v > x.data<float>()[r * kFeatures + label]) label = c;
    }
    y.data<int64_t>()[r] = label;
  }
}

int main() {
  try {
    // 1. Join the job: rank, world size and rank 0's address come from the environment.
    comm::init(comm::DistributedConfig::fromEnvironment());
    const comm::DistributedConfig config = comm::currentConfig("example");
    std::shared_ptr<comm::Backend> backend = comm::backend("example");
    const int rank = config.rank, world = config.worldSize;

    // 2. A collective: every rank contributes rank + 1; all_reduce sums them in place on every rank.
    Tensor t = Tensor::zeros({1});
    t.data<float>()[0] = static_cast<float>(rank + 1);
    backend->allReduce(t, comm::ReduceOp::Sum, /*async=*/false)->wait();
    std::printf("[rank %d/%d] all_reduce: sum of 1..%d = %g\n", rank, world, world, t.data<float>()[0]);

    // 3. A small MLP, wrapped in DistributedDataParallel: rank 0's weights are copied to every rank,
    //    and each step's gradients are averaged across the ranks during backward.
    cyxwiz::manualSeed(0);
    auto model = std::make_shared<nn::SequentialModel>();
    model->add(std::make_shared<nn::LinearModule>(kFeatures, 32));
    model->add(std::make_shared<nn::ReLUModule>());
    model->add(std::make_shared<nn::LinearModule>(32, kClasses));
    cyxwiz::ddp::DistributedDataParallel ddp(model);
    nn::AdamOptimizer optimizer(0.01);
    nn::CrossEntropyLoss loss;

    // 4. Train: forward, loss, backward (gradients averaged across ranks), optimizer step.
    Tensor x = Tensor::empty({kBatch, kFeatures});
    Tensor y = Tensor::empty({kBatch}, cyxwiz::DType::Int64);
    for (int step = 1; step <= 50; ++step) {
      makeBatch(rank, step, x, y);
      Tensor out = ddp.forward(x);
      const double value = loss.forward(out, y);  // this rank's batch
      ddp.backward(loss.backward(out, y));
      ddp.updateParameters(optimizer);  // also zeroes the gradients for the next step

      // The loss over every rank's batch: the mean of the ranks' losses.
      Tensor mean = Tensor::zeros({1}, cyxwiz::DType::Float64);
      mean.data<double>()[0] = value;
      backend->allReduce(mean, comm::ReduceOp::Avg, false)->wait();
      if (rank == 0 && (step == 1 || step % 10 == 0)) {
        std::printf("step %2d  loss %.4f\n", step, mean.data<double>()[0]);
      }
    }

    // 5. Leave the job (every rank; the others see a goodbye, not a crash).
    backend.reset();
    comm::finalize();
    return 0;
  } catch (const cyxwiz::Error& e) {  // the engine's errors: NetworkError, TimeoutError, ...
    std::fprintf(stderr, "error: %s\n", e.what());
    comm::finalize();
    return 1;
  }
}
