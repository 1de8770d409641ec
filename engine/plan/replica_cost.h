#pragma once
// The cost model of strategies ddp and zero (plugins/ddp, plugins/zero): one rank's memory and
// the gradients' and parameters' traffic of whole replicas. Torch-free.
#include <cstdint>
#include <string>

#include "hf/config.h"
#include "job/job_spec.h"
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

// What a rank of ddp / zero holds, in words (StrategyCost::held).
std::string ddp_held(const hf::ModelConfig& c, const Settings& s, std::uint64_t checkpoint_bytes,
                     int world_size);
std::string zero_held(const hf::ModelConfig& c, const Settings& s, std::uint64_t checkpoint_bytes,
                      int world_size);
// The strategy `auto` writes for them: on the CPU, where the plan weighed them (their own device
// "auto" would take GPUs the plan did not weigh); zero with its stage.
job::StrategySpec ddp_written_as(const Settings& s);
job::StrategySpec zero_written_as(const Settings& s);
// zero's layouts: stage 1 or 2.
bool zero_valid(const Settings& s);

}  // namespace tessera::plan
