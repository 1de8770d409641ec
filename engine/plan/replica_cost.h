#pragma once
// The cost model of strategies ddp and zero (plugins/ddp, plugins/zero): one rank's memory and
// the gradients' and parameters' traffic of whole replicas. Torch-free.
#include <cstdint>

#include "hf/config.h"
#include "plan/planner.h"
#include "plan/settings.h"

namespace tessera::plan {

// One rank of ddp or zero over `world_size` ranks, refining single's estimate `e`.
void replica_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                    std::uint64_t checkpoint_bytes, int world_size);
// zero's CPU-offloaded optimizer (a device run's host tier): the rank's masters, moments and
// gradients of its share.
MemoryEstimate zero_offload_host_memory(const hf::ModelConfig& c, const Settings& s,
                                        int world_size);
// Bytes and calls per step through one rank: the gradients' all_reduce (ddp, zero 1) or
// reduce_scatter (zero 2) in buckets of `bucket_bytes`, and zero's all_gather of the shares.
Communication replica_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                    std::uint64_t bucket_bytes);

}  // namespace tessera::plan
