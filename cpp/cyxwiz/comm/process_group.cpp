#include "cyxwiz/comm/process_group.h"

#include <mutex>

#include "cyxwiz/comm/cpu/cpu_backend.h"
#include "cyxwiz/comm/nccl/nccl_backend.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/device/cuda.h"

namespace cyxwiz::comm {

using cpu::CpuBackend;
using nccl::NcclBackend;

namespace {

std::mutex gMutex;
std::shared_ptr<Backend> gBackend;
uint32_t gCompletedInits = 0;  // a failed init() may be retried under the same number

[[noreturn]] void notInitialized(const char* operation) {
  throw DistError(makeString(operation, ": cx.distributed is not initialized: call cx.distributed.init() first"));
}

}  // namespace

void init(const DistributedConfig& config) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gBackend) {
    throw DistError(makeString(rankPrefix(), "init: already initialized (", gBackend->config().describe(),
                               "); call cx.distributed.finalize() before init() again"));
  }
  config.validate();
  // (A CPU-only build can still load another build of the CUDA library: CYXWIZ_CUDA_LIBRARY, the tests' emulator.)
  if (config.backend == BackendType::NCCL && !device::cudaBuilt() && !device::tryCudaApi()) {
    throw BackendError(makeString(
        "init: this pycyxwiz build has no NCCL backend (", device::cudaBuildNote(), "). Use BackendType.CPU "
        "(DISTRIBUTED_BACKEND=cpu), or rebuild on a machine with the CUDA toolkit and the nvidia-nccl-cu13 and "
        "nvidia-cublas wheels installed: pip install --no-build-isolation ."));
  }
  setLogRank(config.rank, config.worldSize);
  DistributedConfig c = config;
  c.readTuning();  // an explicit config too: the tuning variables apply to every job
  c.generation = gCompletedInits + 1;
  try {
    const Device gpu = c.backend == BackendType::NCCL ? NcclBackend::deviceFor(c) : Device{};
    auto cpu = std::make_shared<CpuBackend>(c);
    // The rendezvous is done: this generation is used, even if NCCL fails below and init() is retried.
    ++gCompletedInits;
    if (c.backend == BackendType::NCCL) {
      gBackend = std::make_shared<NcclBackend>(c, gpu, std::move(cpu));
    } else {
      gBackend = std::move(cpu);
    }
  } catch (...) {
    clearLogRank();
    throw;
  }
}

void finalize() {
  std::shared_ptr<Backend> b;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    b.swap(gBackend);
  }
  if (b) b->shutdown();
  clearLogRank();
}

bool isInitialized() {
  std::lock_guard<std::mutex> lock(gMutex);
  return gBackend != nullptr;
}

std::shared_ptr<Backend> backend(const char* operation) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (!gBackend) notInitialized(operation);
  return gBackend;
}

DistributedConfig currentConfig(const char* operation) { return backend(operation)->config(); }

}  // namespace cyxwiz::comm
