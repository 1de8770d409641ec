#pragma once
// Each strategy's cost model, by the name a job spec gives it: what one rank holds beyond single's
// estimate, and what it sends per step. The planner's estimate_memory and estimate_communication
// look a strategy up here instead of comparing names; each model lives in its own file
// (plan/gemini_cost.h, plan/replica_cost.h, plan/hybrid_cost.h). Torch-free.
#include <cstdint>
#include <string>

#include "hf/config.h"
#include "plan/settings.h"

namespace tessera::plan {

struct MemoryEstimate;  // plan/planner.h
struct Communication;

struct StrategyCost {
  const char* name;
  // Refines single's estimate `e` into one rank's of `world_size` (null: single's as it is).
  void (*memory)(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                 std::uint64_t checkpoint_bytes, int world_size);
  // Bytes and calls through one rank per step over `world_size` ranks (null: none); the
  // planner prices them at the measured link.
  Communication (*communication)(const hf::ModelConfig& c, const Settings& s, int world_size,
                                 std::uint64_t bucket_bytes);
  // One rank's compute seconds per step of `tokens` at `rank_flops` (null: its replica's whole
  // model, plan/step_cost.h's model_work).
  double (*compute)(const hf::ModelConfig& c, const Settings& s, int world_size, double tokens,
                    double rank_flops);
  // Whether its ranks share one step's work (single's never do).
  bool distributes;
  // How the plan's reasons name it with its settings, "zero stage 2", "hybrid tp 2 × pp 2" (null:
  // its name).
  std::string (*phrase)(const Settings& s);
  // Whether each rank keeps a share of the gradients (reduce_scatter) instead of all of them
  // (all_reduce) (null: all of them).
  bool (*scatters_gradients)(const Settings& s);
  // What a layout of it pays for the memory it saves, as the reasons say it (null: "more
  // communication").
  const char* saves_memory_by;
};

// The cost model of strategy `name`; nullptr for a name no model covers.
const StrategyCost* strategy_cost(const std::string& name);

// `s.strategy` as the reasons name it (StrategyCost::phrase).
std::string strategy_phrase(const Settings& s);
// Whether `s.strategy`'s ranks share a step's work (StrategyCost::distributes).
bool distributes(const Settings& s);
// Whether each rank of `s` keeps a share of the gradients (StrategyCost::scatters_gradients).
bool scatters_gradients(const Settings& s);
// What a layout of `s` pays for the memory it saves (StrategyCost::saves_memory_by).
std::string saves_memory_by(const Settings& s);

}  // namespace tessera::plan
