#include "cyxwiz/comm/config.h"

#include <cctype>
#include <cstdlib>
#include <optional>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Strict base-10: "4" yes; "", "4x", " 4", "1e3" no.
int64_t parseInteger(const char* name, const std::string& value, const char* expected) {
  size_t i = (value.size() > 1 && (value[0] == '-' || value[0] == '+')) ? 1 : 0;
  bool ok = i < value.size() && value.size() <= 18;
  for (size_t k = i; ok && k < value.size(); ++k) ok = std::isdigit(static_cast<unsigned char>(value[k])) != 0;
  if (!ok) throw InvalidArgument(makeString(name, "='", value, "' is not an integer: expected ", expected));
  return std::stoll(value);
}

int64_t requireRange(const char* name, int64_t v, int64_t lo, int64_t hi, const std::string& expected) {
  if (v < lo || v > hi) throw InvalidArgument(makeString(name, "=", v, " is out of range: expected ", expected));
  return v;
}

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
    c.worldSize = static_cast<int>(requireRange(vars.size, parseInteger(vars.size, *size, "the number of processes"), 1,
                                                1 << 20, "at least 1"));
    if (!rank && c.worldSize > 1) {
      throw InvalidArgument(makeString(vars.size, "=", *size, " is set but ", vars.rank, " is not: set ", vars.rank,
                                       " to this process's rank, 0..", c.worldSize - 1));
    }
    std::string ranks = makeString("0..", c.worldSize - 1, " (", vars.size, "=", c.worldSize, ")");
    if (rank) c.rank = static_cast<int>(requireRange(vars.rank, parseInteger(vars.rank, *rank, ranks.c_str()), 0, c.worldSize - 1, ranks));
    c.localRank = c.rank;  // the guide: LOCAL_RANK defaults to RANK
    if (auto local = env(vars.local)) {
      c.localRank = static_cast<int>(requireRange(vars.local, parseInteger(vars.local, *local, "a GPU index >= 0"), 0, 1 << 20, "a GPU index >= 0"));
    } else if (auto anyLocal = env("LOCAL_RANK")) {
      c.localRank = static_cast<int>(requireRange("LOCAL_RANK", parseInteger("LOCAL_RANK", *anyLocal, "a GPU index >= 0"), 0, 1 << 20, "a GPU index >= 0"));
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
    c.masterPort = static_cast<int>(requireRange("MASTER_PORT", parseInteger("MASTER_PORT", *port, "a TCP port, 1..65535"), 1, 65535, "a TCP port, 1..65535"));
    // Under torchrun the agent's own store already listens on MASTER_PORT: take the next port.
    if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
      c.masterPort = c.masterPort < 65000 ? c.masterPort + 1 : c.masterPort - 16;
      c.portSpan = 8;  // MASTER_PORT + 1 may be someone's ephemeral port: rank 0 takes the first free one
      if (c.source == "RANK/WORLD_SIZE") c.source = "torchrun";
    }
  }
  if (auto port = env("CYXWIZ_MASTER_PORT")) {
    c.portSpan = 1;
    c.masterPort = static_cast<int>(requireRange("CYXWIZ_MASTER_PORT", parseInteger("CYXWIZ_MASTER_PORT", *port, "a TCP port, 1..65535"), 1, 65535, "a TCP port, 1..65535"));
  }
  if (auto backend = env("DISTRIBUTED_BACKEND")) c.backend = parseBackend("DISTRIBUTED_BACKEND", *backend);
  if (auto timeout = env("DISTRIBUTED_TIMEOUT_MS")) {
    c.timeoutMs = requireRange("DISTRIBUTED_TIMEOUT_MS", parseInteger("DISTRIBUTED_TIMEOUT_MS", *timeout, "milliseconds > 0"), 1,
                               int64_t{1} << 40, "milliseconds > 0");
  }
  c.jobId = jobIdFromEnvironment();
  if (auto secret = env("CYXWIZ_SECRET")) c.secret = *secret;
  return c;
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
  if (masterAddr.empty()) throw InvalidArgument("DistributedConfig.master_addr is empty: expected the host name or IP address of rank 0");
}

std::string DistributedConfig::describe() const {
  return makeString("rank ", rank, "/", worldSize, " (local ", localRank, "), master ", masterAddr, ":", masterPort, ", ",
                    backendName(backend), ", timeout ", timeoutMs, " ms", jobId.empty() ? "" : ", job " + jobId,
                    ", from ", source, secret.empty() ? "" : ", with a shared secret");
}

int ranksOnThisHost(int worldSize) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  long n = local ? std::atol(local) : 0;
  return n > 0 && n <= worldSize ? static_cast<int>(n) : worldSize;
}

}  // namespace cyxwiz::comm
