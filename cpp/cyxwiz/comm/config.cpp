#include "cyxwiz/comm/config.h"

#include <cctype>
#include <optional>

#include "cyxwiz/common/env.h"
#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

namespace {

std::optional<std::string> env(const char* name) { return envString(name); }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

BackendType parseBackend(const char* name, const std::string& value) {
  std::string v = lower(value);
  if (v == "cpu" || v == "tcp" || v == "gloo") return BackendType::CPU;
  if (v == "nccl" || v == "gpu" || v == "cuda") return BackendType::NCCL;
  throw InvalidArgument(makeString(name, "='", value, "' is not a backend: expected 'cpu' or 'nccl'"));
}

struct RankVars {
  const char* rank;
  const char* size;
  const char* local;
  const char* source;
};

constexpr RankVars kLaunchers[] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPICH"},
};

std::string jobIdFromEnvironment() {
  for (const char* name : {"CYXWIZ_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    if (auto v = env(name)) return *v;
  }
  if (auto job = env("SLURM_JOB_ID")) {
    auto step = env("SLURM_STEP_ID");
    return step ? *job + "." + *step : *job;
  }
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_ID_STRING"}) {
    if (auto v = env(name)) return *v;
  }
  return "";
}

}  // namespace

const char* backendName(BackendType b) { return b == BackendType::NCCL ? "nccl" : "cpu"; }

std::string firstSlurmHost(const std::string& nodeList) {
  std::string host;
  int depth = 0;
  bool takingRange = false;  // inside [...]: keep the first item only
  for (char c : nodeList) {
    if (depth == 0 && c == ',') break;
    if (c == '[') {
      ++depth;
      takingRange = true;
      continue;
    }
    if (c == ']') {
      --depth;
      takingRange = false;
      continue;
    }
    if (depth > 0) {
      if (c == ',' || c == '-') takingRange = false;
      if (takingRange) host += c;
      continue;
    }
    host += c;
  }
  return host;
}

DistributedConfig DistributedConfig::fromEnvironment() {
  DistributedConfig c;
  for (const RankVars& vars : kLaunchers) {
    auto rank = env(vars.rank);
    auto size = env(vars.size);
    if (!rank && !size) continue;
    if (!size) {
      throw InvalidArgument(makeString(vars.rank, "=", *rank, " is set but ", vars.size,
                                       " is not: set both (", vars.size, " = the number of processes), or neither to run a single process"));
    }
    c.worldSize = static_cast<int>(checkedInteger(vars.size, *size, 1, 1 << 20, "the number of processes, at least 1"));
    if (!rank && c.worldSize > 1) {
      throw InvalidArgument(makeString(vars.size, "=", *size, " is set but ", vars.rank, " is not: set ", vars.rank,
                                       " to this process's rank, 0..", c.worldSize - 1));
    }
    std::string ranks = makeString("0..", c.worldSize - 1, " (", vars.size, "=", c.worldSize, ")");
    if (rank) c.rank = static_cast<int>(checkedInteger(vars.rank, *rank, 0, c.worldSize - 1, ranks));
    c.localRank = c.rank;  // the guide: LOCAL_RANK defaults to RANK
    if (auto local = env(vars.local)) {
      c.localRank = static_cast<int>(checkedInteger(vars.local, *local, 0, 1 << 20, "a GPU index >= 0"));
    } else if (auto anyLocal = env("LOCAL_RANK")) {
      c.localRank = static_cast<int>(checkedInteger("LOCAL_RANK", *anyLocal, 0, 1 << 20, "a GPU index >= 0"));
    }
    c.source = vars.source;
    break;
  }
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw InvalidArgument("MASTER_ADDR is set but empty: expected the host name or IP address of rank 0");
    c.masterAddr = *addr;
  } else if (c.source == "Slurm") {
    auto list = env("SLURM_JOB_NODELIST");
    if (!list) list = env("SLURM_NODELIST");
    if (list && !firstSlurmHost(*list).empty()) c.masterAddr = firstSlurmHost(*list);
  }
  if (auto port = env("MASTER_PORT")) {
    c.masterPort = static_cast<int>(checkedInteger("MASTER_PORT", *port, 1, 65535, "a TCP port, 1..65535"));
    // Under torchrun the agent's own store already listens on MASTER_PORT: take the next port.
    if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
      c.masterPort = c.masterPort < 65000 ? c.masterPort + 1 : c.masterPort - 16;
      c.portSpan = 8;  // MASTER_PORT + 1 may be someone's ephemeral port: rank 0 takes the first free one
      if (c.source == "RANK/WORLD_SIZE") c.source = "torchrun";
    }
  }
  if (auto port = env("CYXWIZ_MASTER_PORT")) {
    c.portSpan = 1;
    c.masterPort = static_cast<int>(checkedInteger("CYXWIZ_MASTER_PORT", *port, 1, 65535, "a TCP port, 1..65535"));
  }
  if (auto backend = env("DISTRIBUTED_BACKEND")) c.backend = parseBackend("DISTRIBUTED_BACKEND", *backend);
  if (auto timeout = env("DISTRIBUTED_TIMEOUT_MS")) {
    c.timeoutMs = checkedInteger("DISTRIBUTED_TIMEOUT_MS", *timeout, 1, int64_t{1} << 40, "milliseconds > 0");
  }
  c.jobId = jobIdFromEnvironment();
  if (auto secret = env("CYXWIZ_SECRET")) c.secret = *secret;
  c.readTuning();
  return c;
}

void DistributedConfig::readTuning() {
  ringSliceBytes = envInt("CYXWIZ_RING_SLICE_BYTES", kDefaultRingSliceBytes, 1024, int64_t{1} << 30,
                          "a number of bytes without a unit, 1024..1073741824 (default 1048576, 1 MiB)");
  spinUs = envInt("CYXWIZ_SPIN_US", -1, 0, 1000000, "microseconds without a unit, 0..1000000");
  // Larger than the world (a stale value, a hand-started job): the whole world is the upper bound.
  localWorldSize = static_cast<int>(envInt("LOCAL_WORLD_SIZE", 0, 1, 1 << 20, "the number of ranks on this machine, at least 1"));
  if (auto t = envString("CYXWIZ_TRANSPORT"); t && !t->empty()) {
    const std::string& v = *t;
    if (v != "auto" && v != "tcp" && v != "shm") {
      throw InvalidArgument(makeString("CYXWIZ_TRANSPORT='", v, "' is not a transport: expected auto (the default: shared "
                                       "memory among the ranks of each host), tcp or shm"));
    }
    transport = v;
  }
  if (auto a = envString("CYXWIZ_SHM_ALGORITHM"); a && !a->empty()) {
    if (*a != "direct" && *a != "ring") {
      throw InvalidArgument(makeString("CYXWIZ_SHM_ALGORITHM='", *a, "' is not an algorithm: expected direct (the default: "
                                       "each rank reduces its part reading the others' memory) or ring"));
    }
    shmAlgorithm = *a;
  }
}

void DistributedConfig::validate() const {
  if (worldSize < 1) throw InvalidArgument(makeString("DistributedConfig.world_size=", worldSize, " is out of range: expected at least 1"));
  if (rank < 0 || rank >= worldSize) {
    throw InvalidArgument(makeString("DistributedConfig.rank=", rank, " is out of range: expected 0..", worldSize - 1,
                                     " (world_size=", worldSize, ")"));
  }
  if (localRank < 0) throw InvalidArgument(makeString("DistributedConfig.local_rank=", localRank, " is out of range: expected >= 0"));
  if (masterPort < 1 || masterPort > 65535) {
    throw InvalidArgument(makeString("DistributedConfig.master_port=", masterPort, " is out of range: expected a TCP port, 1..65535"));
  }
  if (timeoutMs <= 0) throw InvalidArgument(makeString("DistributedConfig.timeout_ms=", timeoutMs, " is out of range: expected milliseconds > 0"));
  if (transport != "auto" && transport != "tcp" && transport != "shm") {
    throw InvalidArgument(makeString("DistributedConfig.transport='", transport, "' is not a transport: expected auto, tcp or shm"));
  }
  if (masterAddr.empty()) throw InvalidArgument("DistributedConfig.master_addr is empty: expected the host name or IP address of rank 0");
}

std::string DistributedConfig::describe() const {
  return makeString("rank ", rank, "/", worldSize, " (local ", localRank, "), master ", masterAddr, ":", masterPort, ", ",
                    backendName(backend), transport == "auto" ? "" : ", transport " + transport, ", timeout ", timeoutMs, " ms", jobId.empty() ? "" : ", job " + jobId,
                    ", from ", source, secret.empty() ? "" : ", with a shared secret");
}

int ranksOnThisHost(const DistributedConfig& config) {
  const int n = config.localWorldSize;
  return n > 0 && n <= config.worldSize ? n : config.worldSize;
}

}  // namespace cyxwiz::comm
