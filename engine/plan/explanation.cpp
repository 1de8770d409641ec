#include "plan/explanation.h"

#include <algorithm>
#include <set>
#include <vector>

#include "job/strategies.h"
#include "plan/plan_text.h"
#include "plan/strategy_costs.h"

namespace tessera::plan {

namespace {

std::string time_of(const Plan::Candidate& c) {
  return "about " + seconds_text(c.seconds_per_step) + " per step by the cost model, " +
         seconds_text(c.communication_seconds) + " of it communication" +
         (c.bubble > 0.0 ? " and " + percent(c.bubble) + " of it idle in the pipeline's bubble"
                         : std::string());
}

// The settings a candidate fits with where they differ from the chosen's: "at micro-batch 2 with
// activation checkpointing".
std::string fitted_at(const Plan::Candidate& c, const Settings& chosen) {
  std::string out;
  if (c.settings.micro_batch != chosen.micro_batch)
    out += " at micro-batch " + std::to_string(c.settings.micro_batch);
  if (c.settings.activation_checkpointing && !chosen.activation_checkpointing)
    out += " with activation checkpointing";
  return out;
}

// Why candidate `c` lost to `chosen`, in figures.
std::string why_not(const Plan::Candidate& c, const Plan::Candidate& chosen, std::uint64_t limit,
                    bool splitting_last) {
  const std::string name = strategy_phrase(c.settings);
  if (!c.fits)
    return name + " would need " + gib(c.peak) + " per rank" +
           (c.peak_when == "training" ? std::string() : " while " + c.peak_when) +
           " even at micro-batch 1 with activation checkpointing, more than the " + gib(limit) +
           " a rank may use";
  const std::string at = fitted_at(c, chosen.settings);
  const std::string against = ", against " + seconds_text(chosen.seconds_per_step);
  if (splitting_last && c.settings.tp_size * c.settings.pp_size > 1 &&
      c.seconds_per_step < chosen.seconds_per_step)
    return name + " fits too" + at + " (" + gib(c.peak) + " per rank): " + time_of(c) + against +
           "; auto splits layers over ranks only where no layout keeping whole layers fits "
           "(name hybrid with these sizes to run it)";
  if (!at.empty())
    return name + " fits only" + at + " (" + gib(c.peak) + " per rank): " + time_of(c) + against;
  // A saving under 1% is none worth a slower step (it read "would save 0.00 GiB").
  if (static_cast<double>(c.peak) < 0.99 * static_cast<double>(chosen.peak))
    return name + " would save " + gib(chosen.peak - c.peak) + " per rank (" + gib(c.peak) +
           ") but costs " + saves_memory_by(c.settings) + ": " + time_of(c) + against;
  return name + " fits too (" + gib(c.peak) + " per rank) but is no quicker: " + time_of(c) +
         against;
}

}  // namespace

void explain_distributed(Plan& plan, const PlanInputs& in, std::uint64_t limit,
                         const std::string& names, const LayoutRank& rank) {
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [&](const Plan::Candidate& a, const Plan::Candidate& b) {
                     if (a.chosen != b.chosen) return a.chosen;
                     if (a.fits != b.fits) return a.fits;
                     if (!a.fits) return a.peak < b.peak;
                     return rank(a.settings, a.seconds_per_step) <
                            rank(b.settings, b.seconds_per_step);
                   });
  const Plan::Candidate& chosen = plan.candidates.front();
  const std::string share = gib(limit) + " a rank may use (" + gib(plan.host_usable) +
                            " usable on this machine ÷ " + std::to_string(plan.processes_per_node) +
                            " ranks, less " + std::to_string(static_cast<int>(kHeadroom * 100)) +
                            "% headroom)";
  const std::string categories = "weights " + gib(chosen.weights) + ", gradients " +
                                 gib(chosen.gradients) + ", optimizer state " +
                                 gib(chosen.optimizer);
  const std::string held =
      held_by_rank(in.model, plan.settings, in.checkpoint_bytes, plan.processes);
  plan.candidates.front().summary = strategy_phrase(plan.settings) + ": " +
                                    (held.empty() ? std::string() : held + " ") + "(" + categories +
                                    "): " + gib(chosen.peak) + " per rank, within the " + share +
                                    "; " + time_of(chosen);
  // Whether `auto` ranked layouts that split layers last (a named strategy ranks by time alone).
  const bool splitting_last = in.spec.strategy.name == job::kAutoStrategy;
  std::vector<std::string> lines = {"strategy " + plan.candidates.front().summary};
  std::set<std::string> named_families = {chosen.family};
  for (std::size_t i = 1; i < plan.candidates.size(); ++i) {
    Plan::Candidate& c = plan.candidates[i];
    c.summary = why_not(c, plan.candidates.front(), limit, splitting_last);
    if (i == 1) {
      lines.push_back("runner-up: " + c.summary);
      named_families.insert(c.family);
      continue;
    }
    if (!named_families.insert(c.family).second) continue;
    const auto layouts =
        std::count_if(plan.candidates.begin(), plan.candidates.end(),
                      [&](const Plan::Candidate& o) { return o.family == c.family; });
    // A family of one layout is named by its summary alone ("gemini would save ...").
    lines.push_back(layouts > 1 ? c.family + " (the best of its " + std::to_string(layouts) +
                                      " layouts): " + c.summary
                                : c.summary);
  }
  const job::StrategyInfo* zero = job::find_strategy("zero");
  if (zero == nullptr || !zero->planned)
    lines.push_back(
        std::string("zero (ZeRO stages 1 and 2, which shard the optimizer state and ") +
        "gradients over the ranks) is " +
        (zero == nullptr ? "not in this build yet" : "not planned yet") + ": " + names +
        (names.find(',') == std::string::npos ? " is the only strategy" : " are the strategies") +
        " the planner distributes with");
  plan.reasons.insert(plan.reasons.begin(), lines.begin(), lines.end());
}

}  // namespace tessera::plan
