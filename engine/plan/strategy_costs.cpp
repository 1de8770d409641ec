#include "plan/strategy_costs.h"

#include <array>

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

}  // namespace

const StrategyCost* strategy_cost(const std::string& name) {
  static const std::array<StrategyCost, 5> costs{{
      {.name = "single",
       .memory = nullptr,
       .communication = nullptr,
       .compute = nullptr,
       .distributes = false,
       .phrase = nullptr,
       .scatters_gradients = nullptr,
       .saves_memory_by = nullptr},
      {.name = "gemini",
       .memory = gemini_memory,
       .communication = gemini_communication,
       .compute = nullptr,
       .distributes = true,
       .phrase = nullptr,
       .scatters_gradients = always,
       .saves_memory_by = "all_gathers of the parameters as every forward and backward uses "
                          "them and a reduce_scatter of the gradients in every micro-batch"},
      {.name = "ddp",
       .memory = replica_memory,
       .communication = replica_communication,
       .compute = nullptr,
       .distributes = true,
       .phrase = nullptr,
       .scatters_gradients = nullptr,
       .saves_memory_by = nullptr},
      {.name = "zero",
       .memory = replica_memory,
       .communication = replica_communication,
       .compute = nullptr,
       .distributes = true,
       .phrase = zero_phrase,
       .scatters_gradients = zero_scatters_gradients,
       .saves_memory_by = "an all_gather of the parameters every step"},
      {.name = "hybrid",
       .memory = hybrid_memory,
       .communication = hybrid_communication,
       .compute = hybrid_compute_seconds,
       .distributes = true,
       .phrase = hybrid_phrase,
       .scatters_gradients = nullptr,
       .saves_memory_by = "all-reduces of activations in every layer (tensor parallel) and idle "
                          "time while the pipeline fills and drains"},
  }};
  for (const StrategyCost& cost : costs)
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
  return cost && cost->saves_memory_by ? cost->saves_memory_by : "more communication";
}

}  // namespace tessera::plan
