#pragma once
// Where this process stands in a job of several processes, read from torchrun's environment
// convention (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), so a job
// runs under torchrun, `srun`, `mpirun` or `tessera-cli launch` alike; and the timeouts of the
// distributed runtime (TESSERA_DIST_TIMEOUT_S, TESSERA_DIST_RENDEZVOUS_TIMEOUT_S). Torch-free.
#include <chrono>
#include <cstdint>
#include <string>

namespace tessera::dist {

struct DistEnvironment {
  std::string master_addr;        // host of rank 0's rendezvous store; empty for one process
  std::uint16_t master_port = 0;  // its TCP port; 0 for one process
  int rank = 0;                   // this process among all: 0 .. world_size-1
  int world_size = 1;             // number of processes in the job
  int local_rank = 0;             // this process among those on its machine
  int local_world_size = 1;       // number of processes on this machine

  bool is_distributed() const { return world_size > 1; }
};

// WORLD_SIZE absent or 1: one process, nothing else is read (RANK, if set, must be 0).
// WORLD_SIZE above 1: every variable above is required and checked (integers, ranges, rank below
// world size, local rank below local world size). Throws tessera::Error (InvalidInput) whose
// message names the variable and its value and whose hint says what to set.
DistEnvironment read_dist_environment();

struct DistTimeouts {
  // Every rank must reach the rendezvous store (rank 0 starts it) within this long.
  std::chrono::milliseconds rendezvous{std::chrono::seconds(300)};
  // A collective (and a process group's connection set-up) that waits this long on a peer fails.
  std::chrono::milliseconds collective{std::chrono::seconds(300)};

  // How often each rank proves through the store that it is alive: a tenth of the collective
  // timeout, between 100 ms and 5 s. A peer silent for three intervals is named as the failed one.
  std::chrono::milliseconds heartbeat_interval() const;
};

// Defaults above; TESSERA_DIST_TIMEOUT_S (seconds, decimals allowed) sets the collective timeout
// and, unless TESSERA_DIST_RENDEZVOUS_TIMEOUT_S is set too, the rendezvous timeout.
// Throws tessera::Error (InvalidInput) for a value that is not a positive number.
DistTimeouts read_dist_timeouts();

}  // namespace tessera::dist
