#pragma once
// Each strategy's cost model, by the name a job spec gives it: what one rank holds beyond single's
// estimate, and what it sends per step. The planner's estimate_memory and estimate_communication
// look a strategy up here instead of comparing names; each model lives in its own file
// (plan/gemini_cost.h, plan/replica_cost.h, plan/hybrid_cost.h). Torch-free.
#include <cstdint>
#include <string>
#include <vector>

#include "hf/config.h"
#include "job/job_spec.h"
#include "plan/settings.h"

namespace tessera::plan {

struct MemoryEstimate;  // plan/planner.h
struct Communication;

struct StrategyCost {
  const char* name = nullptr;
  // Refines single's estimate `e` into one rank's of `world_size` (null: single's as it is).
  void (*memory)(MemoryEstimate& e, const hf::ModelConfig& c, const Settings& s,
                 std::uint64_t checkpoint_bytes, int world_size) = nullptr;
  // Bytes and calls through one rank per step over `world_size` ranks (null: none); the
  // planner prices them at the measured link.
  Communication (*communication)(const hf::ModelConfig& c, const Settings& s, int world_size,
                                 std::uint64_t bucket_bytes) = nullptr;
  // One rank's compute seconds per step of `tokens` at `rank_flops` (null: its replica's whole
  // model, plan/step_cost.h's model_work).
  double (*compute)(const hf::ModelConfig& c, const Settings& s, int world_size, double tokens,
                    double rank_flops) = nullptr;
  // Whether its ranks share one step's work (single's never do).
  bool distributes = false;
  // How the plan's reasons name it with its settings, "zero stage 2", "hybrid tp 2 × pp 2" (null:
  // its name).
  std::string (*phrase)(const Settings& s) = nullptr;
  // Whether each rank keeps a share of the gradients (reduce_scatter) instead of all of them
  // (all_reduce) (null: all of them).
  bool (*scatters_gradients)(const Settings& s) = nullptr;
  // What a layout of it pays for the memory it saves, as the reasons say it (null: "more
  // communication").
  std::string (*saves_memory_by)(const Settings& s) = nullptr;
  // The layouts of `processes` ranks the planner weighs, appended to `out`, each `base` with its
  // layout fields set: `written`, the spec's own settings when the spec names this strategy
  // (then only its layout), else null (every layout that divides the processes and the model).
  // Null: `base` alone.
  void (*layouts)(const hf::ModelConfig& c, int processes, const Settings& base,
                  const Settings* written, std::vector<Settings>& out) = nullptr;
  // Weighed after the others: it shards the most, so a tie in step time goes to an earlier one.
  bool weighed_last = false;
  // The family of layouts the explanation names once, by its best ("tensor parallel") (null:
  // the phrase).
  std::string (*family)(const Settings& s) = nullptr;
  // What one rank of `world_size` holds, in words, for the plan's first reason (null: nothing to
  // say beyond the categories).
  std::string (*held)(const hf::ModelConfig& c, const Settings& s, std::uint64_t checkpoint_bytes,
                      int world_size) = nullptr;
  // The strategy a job `auto` planned runs with: the name and the options its settings take,
  // the device the plan weighed included (null: the name alone).
  job::StrategySpec (*written_as)(const Settings& s) = nullptr;
  // Whether a plan's recorded settings (a run folder's plan.json) are a layout it has (null: any).
  bool (*valid)(const Settings& s) = nullptr;
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
// `s`'s family of layouts (StrategyCost::family).
std::string layout_family(const Settings& s);
// What one rank of `s` holds, in words (StrategyCost::held; empty where it says nothing).
std::string held_by_rank(const hf::ModelConfig& c, const Settings& s,
                         std::uint64_t checkpoint_bytes, int world_size);
// The strategy spec a job `auto` planned as `s` runs with (StrategyCost::written_as).
job::StrategySpec written_strategy(const Settings& s);
// Whether `s` names a strategy with a cost model, laid out as it can be (StrategyCost::valid).
bool valid_layout(const Settings& s);
// The strategies with a cost model, as an error message lists them: "single, gemini, …".
std::string costed_strategies();
// `base` laid out as `layout`: its strategy, zero stage, tp, pp, chunks and sequence parallelism.
Settings with_layout(Settings base, const Settings& layout);
// Whether `a` and `b` are the same strategy laid out the same way (stage, tp, pp, chunks,
// sequence parallelism), whatever their batch, precision or placement.
bool same_layout(const Settings& a, const Settings& b);

// Every layout of `processes` ranks the planner weighs, of the strategies this build plans that
// distribute (`only`: that one alone, laid out as `written` says), in the order ties go by.
// Strategies that cannot train a quantized base or preference pairs are left out where the
// settings ask for them (the caller refuses a named one).
std::vector<Settings> distributed_layouts(const hf::ModelConfig& c, int processes,
                                          const Settings& written, const std::string& only,
                                          bool quantized_base, bool preference);

}  // namespace tessera::plan
