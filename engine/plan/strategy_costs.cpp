#include "plan/strategy_costs.h"

#include <array>

#include "job/strategies.h"
#include "plan/gemini_cost.h"
#include "plan/hybrid_cost.h"
#include "plan/planner.h"
#include "plan/replica_cost.h"

namespace tessera::plan {

namespace {

std::string zero_phrase(const Settings& s) {
  return "zero stage " + std::to_string(s.zero_stage);
}
bool zero_scatters_gradients(const Settings& s) {
  return s.zero_stage >= 2;
}
bool always(const Settings&) {
  return true;
}
// Stages 1 and 2, or the one a spec naming zero writes.
void zero_layouts(const hf::ModelConfig&, int, const Settings& base, const Settings* written,
                  std::vector<Settings>& out) {
  for (int stage : {1, 2}) {
    if (written != nullptr && stage != written->zero_stage) continue;
    Settings t = base;
    t.zero_stage = stage;
    out.push_back(t);
  }
}
std::string zero_family(const Settings&) {
  return "zero";
}
std::string zero_saves_memory_by(const Settings&) {
  return "an all_gather of the parameters every step";
}
std::string gemini_saves_memory_by(const Settings&) {
  return "all_gathers of the parameters as every forward and backward uses them and a "
         "reduce_scatter of the gradients in every micro-batch";
}

const std::array<StrategyCost, 5>& cost_table() {
  // Each entry names what its strategy has; the rest keeps StrategyCost's defaults (none).
  static const std::array<StrategyCost, 5> costs{{
      {.name = "single"},
      {.name = "gemini",
       .memory = gemini_memory,
       .communication = gemini_communication,
       .distributes = true,
       .scatters_gradients = always,
       .saves_memory_by = gemini_saves_memory_by,
       .weighed_last = true,
       .held = gemini_held,
       .written_as = gemini_written_as},
      {.name = "ddp",
       .memory = replica_memory,
       .communication = replica_communication,
       .distributes = true,
       .held = ddp_held,
       .written_as = ddp_written_as},
      {.name = "zero",
       .memory = replica_memory,
       .communication = replica_communication,
       .distributes = true,
       .phrase = zero_phrase,
       .scatters_gradients = zero_scatters_gradients,
       .saves_memory_by = zero_saves_memory_by,
       .layouts = zero_layouts,
       .family = zero_family,
       .held = zero_held,
       .written_as = zero_written_as,
       .valid = zero_valid},
      {.name = "hybrid",
       .memory = hybrid_memory,
       .communication = hybrid_communication,
       .compute = hybrid_compute_seconds,
       .distributes = true,
       .phrase = hybrid_phrase,
       .saves_memory_by = hybrid_saves_memory_by,
       .layouts = hybrid_layouts,
       .family = hybrid_family,
       .held = hybrid_held_by_rank,
       .written_as = hybrid_written_as,
       .valid = hybrid_valid},
  }};
  return costs;
}

}  // namespace

const StrategyCost* strategy_cost(const std::string& name) {
  for (const StrategyCost& cost : cost_table())
    if (name == cost.name) return &cost;
  return nullptr;
}

std::string strategy_phrase(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && cost->phrase ? cost->phrase(s) : s.strategy;
}

bool distributes(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && cost->distributes;
}

bool scatters_gradients(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && cost->scatters_gradients && cost->scatters_gradients(s);
}

std::string saves_memory_by(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && cost->saves_memory_by ? cost->saves_memory_by(s) : "more communication";
}

std::string held_by_rank(const hf::ModelConfig& c, const Settings& s,
                         std::uint64_t checkpoint_bytes, int world_size) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && cost->held ? cost->held(c, s, checkpoint_bytes, world_size) : std::string();
}

job::StrategySpec written_strategy(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  if (cost && cost->written_as) return cost->written_as(s);
  job::StrategySpec out;
  out.name = s.strategy;
  return out;
}

bool valid_layout(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && s.tp_size >= 1 && s.pp_size >= 1 && s.pp_chunks >= 1 &&
         (cost->valid == nullptr || cost->valid(s));
}

std::string costed_strategies() {
  std::string out;
  for (const StrategyCost& cost : cost_table())
    out += (out.empty() ? "" : ", ") + std::string(cost.name);
  return out;
}

std::string layout_family(const Settings& s) {
  const StrategyCost* cost = strategy_cost(s.strategy);
  return cost && cost->family ? cost->family(s) : strategy_phrase(s);
}

Settings with_layout(Settings base, const Settings& layout) {
  base.strategy = layout.strategy;
  base.zero_stage = layout.zero_stage;
  base.tp_size = layout.tp_size;
  base.pp_size = layout.pp_size;
  base.pp_chunks = layout.pp_chunks;
  base.sequence_parallel = layout.sequence_parallel;
  return base;
}

bool same_layout(const Settings& a, const Settings& b) {
  return a.strategy == b.strategy && a.zero_stage == b.zero_stage && a.tp_size == b.tp_size &&
         a.pp_size == b.pp_size && a.pp_chunks == b.pp_chunks &&
         a.sequence_parallel == b.sequence_parallel;
}

std::vector<Settings> distributed_layouts(const hf::ModelConfig& c, int processes,
                                          const Settings& written, const std::string& only,
                                          bool quantized_base, bool preference) {
  std::vector<Settings> first, last;
  for (const job::StrategyInfo& entry : job::strategies()) {
    if (!entry.planned || !entry.distributes || (!only.empty() && entry.name != only)) continue;
    if (only.empty() &&
        ((quantized_base && !entry.quantized_base) || (preference && !entry.preference)))
      continue;
    const StrategyCost* cost = strategy_cost(entry.name);
    if (cost == nullptr || !cost->distributes) continue;
    Settings base;
    base.strategy = entry.name;
    std::vector<Settings>& out = cost->weighed_last ? last : first;
    if (cost->layouts != nullptr)
      cost->layouts(c, processes, base, only.empty() ? nullptr : &written, out);
    else
      out.push_back(base);
  }
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

}  // namespace tessera::plan
