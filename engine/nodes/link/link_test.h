#pragma once
// The c10d link test of `nodes check`: the client and the agent join a 2-rank job (rank 0 on the
// agent, whose address and free port hold the rendezvous store) through engine/dist's
// ParallelContext, and time Gloo all_reduces: 4 bytes for the latency, `bytes` for the bandwidth.
#include <chrono>
#include <cstdint>
#include <string>

namespace tessera::nodes {

struct LinkMeasurement {
  std::uint64_t bytes = 0;      // size of the large all_reduce
  double latency_ms = 0.0;      // median of the 4-byte all_reduces
  double large_ms = 0.0;        // median of the large all_reduces
  double bandwidth_mb_s = 0.0;  // bytes / large time, in MB/s (10^6 bytes), as nccl-tests' algbw
  int small_runs = 0, large_runs = 0;
};

// Both ranks call it with the same arguments but `rank`. Throws tessera::Error (Io) when the
// peer cannot be reached within `timeout` or a collective fails.
LinkMeasurement run_link_test(int rank, const std::string& master_addr, std::uint16_t master_port,
                              std::uint64_t bytes, std::chrono::milliseconds timeout);

}  // namespace tessera::nodes
