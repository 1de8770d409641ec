#include "plan/strategy_costs.h"

#include <array>

#include "plan/gemini_cost.h"
#include "plan/hybrid_cost.h"
#include "plan/planner.h"
#include "plan/replica_cost.h"

namespace tessera::plan {

const StrategyCost* strategy_cost(const std::string& name) {
  static const std::array<StrategyCost, 5> costs{{
      {"single", nullptr, nullptr, nullptr},
      {"gemini", gemini_memory, gemini_communication, nullptr},
      {"ddp", replica_memory, replica_communication, nullptr},
      {"zero", replica_memory, replica_communication, nullptr},
      {"hybrid", hybrid_memory, hybrid_communication, hybrid_compute_seconds},
  }};
  for (const StrategyCost& cost : costs)
    if (name == cost.name) return &cost;
  return nullptr;
}

}  // namespace tessera::plan
