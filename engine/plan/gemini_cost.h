#pragma once
// The cost model of strategy gemini (plugins/gemini): its chunks as the plugin packs them, their
// tiers (host, disk, and the device's), and, sharded over ranks, each rank's shards, gathered
// chunks and traffic, from config.json alone. Torch-free.
#include <cstdint>
#include <string>
#include <utility>

#include "hf/config.h"
#include "job/job_spec.h"
#include "plan/planner.h"
#include "plan/settings.h"

namespace tessera::plan {

// One rank's memory of gemini over `world_size` ranks (one process at 1), refining single's
// estimate `e` (estimate_memory's): the chunks' host and disk tiers, and sharded, the rank's
// shards, whole chunks and gradient chunks in flight.
void gemini_memory(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                   std::uint64_t checkpoint_bytes, int world_size);
// Bytes and calls per step through one rank of gemini sharded over `world_size` ranks.
Communication gemini_communication(const hf::ModelConfig& c, const Settings& s, int world_size,
                                   std::uint64_t bucket_bytes);
// gemini with a device tier over `world_size` ranks (one process: a group of one): {the device's
// share, the host's} of one rank.
std::pair<MemoryEstimate, MemoryEstimate> sharded_device_tiers(const hf::ModelConfig& c,
                                                               const Settings& s,
                                                               std::uint64_t checkpoint_bytes,
                                                               int world_size);

// What a rank of gemini sharded over `world_size` ranks holds, in words (StrategyCost::held; one
// process: nothing, its placement is in the plan's first reason).
std::string gemini_held(const hf::ModelConfig& c, const Settings& s, std::uint64_t checkpoint_bytes,
                        int world_size);
// The strategy `auto` writes for gemini: its shares on disk, and on a GPU its device tier with
// the shares in host memory (on the CPU the device says so: gemini's own "auto" would take the
// GPUs the plan did not weigh).
job::StrategySpec gemini_written_as(const Settings& s);

// A chunk_size the job names that a tensor of the model is larger than: refused as the plugin
// refuses it (InvalidInput naming strategy.options.chunk_size), before anything loads.
void check_gemini_chunk_size(const hf::ModelConfig& c, const job::JobSpec& spec);

}  // namespace tessera::plan
