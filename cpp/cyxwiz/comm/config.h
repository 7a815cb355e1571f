// DistributedConfig: who this process is in the job and how to reach rank 0.
//
// fromEnvironment() reads, in order of precedence: explicit RANK/WORLD_SIZE (also what torchrun
// sets), Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, master host from SLURM_JOB_NODELIST),
// Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK) and MPICH/Intel MPI (PMI_RANK/PMI_SIZE). With none
// of them it describes a world of one, so `python train.py` works unchanged.
#pragma once

#include <cstdint>
#include <string>

namespace cyxwiz::comm {

enum class BackendType { CPU, NCCL };

const char* backendName(BackendType b);

struct DistributedConfig {
  static constexpr int kDefaultPort = 29500;
  static constexpr int64_t kDefaultTimeoutMs = 30000;
  static constexpr int64_t kDefaultRingSliceBytes = 1 << 20;

  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = kDefaultPort;
  // The rendezvous is on the first free port of masterPort .. masterPort + portSpan - 1. 1 unless
  // the port was derived rather than chosen (under torchrun: MASTER_PORT + 1 onwards).
  int portSpan = 1;
  BackendType backend = BackendType::CPU;
  int64_t timeoutMs = kDefaultTimeoutMs;
  // Ranks of one job must agree on it; a connection from another job is refused. From CYXWIZ_JOB_ID
  // (set by our launcher), TORCHELASTIC_RUN_ID, SLURM_JOB_ID.SLURM_STEP_ID or Open MPI's job id.
  std::string jobId;
  // CYXWIZ_SECRET: when set, every connection proves it (HMAC) before it is accepted. Never printed.
  std::string secret;
  // Set by init(): the how-many-th init() of this process (not user-facing).
  uint32_t generation = 0;
  // Where rank and world size came from: "RANK/WORLD_SIZE", "Slurm", "Open MPI", "MPICH", "default".
  std::string source = "default";

  // Tuning, from the environment by readTuning() (init() calls it whatever config it is given), so
  // that the collectives never read the environment themselves. Not user-facing fields.
  int64_t ringSliceBytes = kDefaultRingSliceBytes;  // CYXWIZ_RING_SLICE_BYTES
  int64_t spinUs = -1;                              // CYXWIZ_SPIN_US; -1: chosen from the cores
  int localWorldSize = 0;                           // LOCAL_WORLD_SIZE; 0: not known
  // CYXWIZ_TRANSPORT: "auto" (shared memory among the ranks of each host where it can be proved,
  // else TCP), "tcp" or "shm". After init, get_config() says what the job uses: "shm" (one host),
  // "shm+tcp" (shared memory inside hosts, TCP between them) or "tcp".
  std::string transport = "auto";
  // CYXWIZ_SHM_ALGORITHM: how one host's ranks run collectives in shared memory: "direct" (each rank
  // reduces its part reading the others' memory; window_collectives.h) or "ring" (ring.h over
  // shm/links.h: the ring and recursive doubling, as over TCP).
  std::string shmAlgorithm = "direct";

  // Raises InvalidArgument naming the variable (and what was expected) for any bad or partial value.
  static DistributedConfig fromEnvironment();
  // The tuning fields above from their variables; InvalidArgument naming the variable for a bad value.
  void readTuning();
  // Checks an explicit config before init uses it; messages name the field.
  void validate() const;
  std::string describe() const;  // "rank 1/4 (local 1), master 127.0.0.1:29500, cpu, timeout 30000 ms"
};

// Ranks of the job on this machine: LOCAL_WORLD_SIZE (torchrun, our launcher), else the whole world
// (an upper bound). Policies that share the machine's cores (spinning, overlap) start from it.
int ranksOnThisHost(const DistributedConfig& config);

// First host of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03". Empty for an empty list.
std::string firstSlurmHost(const std::string& nodeList);

}  // namespace cyxwiz::comm
