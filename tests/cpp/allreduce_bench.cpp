// All-reduce timings of a C++ program on the installed package, rank 0 printing one line a size:
//   <transport> <ranks> <bytes> <median us> <bus GB/s>
// tools/windows/prove.sh runs it under Wine (Windows' file mapping and Winsock against Linux's
// /dev/shm and sockets on the same machine: relative figures only). Busbw as nccl-tests counts it:
// bytes * 2(n-1)/n / time.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <exception>
#include <vector>

#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/comm/work.h"
#include "cyxwiz/tensor/tensor.h"

using namespace cyxwiz;

int main(int argc, char** argv) {
  try {
    const comm::DistributedConfig config = comm::DistributedConfig::fromEnvironment();
    comm::init(config);
    auto backend = comm::backend("allreduce_bench");
    const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;  // per size
    for (int64_t floats : {int64_t(1) << 10, int64_t(1) << 16, int64_t(1) << 20, int64_t(1) << 23}) {
      Tensor t = Tensor::zeros({floats});
      std::vector<double> us;
      auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      int done = 0;
      // Every rank runs the same count: rank 0 decides when to stop and broadcasts it each round.
      for (;;) {
        auto start = std::chrono::steady_clock::now();
        backend->allReduce(t, comm::ReduceOp::Sum, false)->wait();
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
        Tensor more = Tensor::zeros({1});
        more.data<float>()[0] = ++done >= 5 && std::chrono::steady_clock::now() > until ? 0.f : 1.f;
        backend->broadcast(more, 0, false)->wait();
        if (more.data<float>()[0] == 0.f) break;
      }
      std::sort(us.begin(), us.end());
      const double median = us[us.size() / 2], bytes = double(floats) * 4, n = config.worldSize;
      if (config.rank == 0) {
        std::printf("%s %d %.0f %.1f %.3f\n", config.transport.c_str(), config.worldSize, bytes, median,
                    bytes * 2 * (n - 1) / n / median / 1e3);
        std::fflush(stdout);
      }
    }
    comm::finalize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
