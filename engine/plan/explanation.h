#pragma once
// Why a plan of several processes distributes as it does, in words and figures (internal to
// engine/plan). Torch-free.
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>

#include "plan/hybrid_cost.h"
#include "plan/planner.h"

namespace tessera::plan {

// How the search ranks layouts that fit, smaller first: whether it splits layers where `auto` puts
// that last, whether checkpointing changed, the accumulation steps the batch took, the step time.
using LayoutKey = std::tuple<bool, bool, std::int64_t, double>;
// A layout's key from its settings and its step time (already computed: a candidate's).
using LayoutRank = std::function<LayoutKey(const Settings&, double seconds_per_step)>;

// Orders plan.candidates (the chosen first, then those that fit by `rank`, then the others by
// their peak), writes each one's summary, and puts in front of the reasons: the chosen layout
// (what a rank holds, by category, against `limit`, its step time), the runner-up, and the best
// layout of each other family (zero, gemini, tensor parallel, ...) with why it lost, in figures.
// `names`: the strategies this build distributes with.
void explain_distributed(Plan& plan, const PlanInputs& in, std::uint64_t limit,
                         const std::string& names, const LayoutRank& rank);

}  // namespace tessera::plan
