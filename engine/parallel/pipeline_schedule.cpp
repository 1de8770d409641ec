#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace tessera::parallel {

std::vector<StageLayers> balance_stages(const std::vector<double>& layer_costs, double before_cost,
                                        double after_cost, int stages) {
  const auto n = static_cast<std::int64_t>(layer_costs.size());
  if (stages < 1 || stages > n)
    throw_invalid(
        "pipeline: " + std::to_string(stages) + " stages for a model of " + std::to_string(n) +
            " layers",
        "each stage needs at least one layer: choose pp_size from 1 to " + std::to_string(n));
  std::vector<double> prefix(static_cast<std::size_t>(n + 1), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    prefix[static_cast<std::size_t>(i + 1)] =
        prefix[static_cast<std::size_t>(i)] + layer_costs[static_cast<std::size_t>(i)];
  const auto cost_of = [&](std::int64_t first, std::int64_t end, int stage) {
    double c = prefix[static_cast<std::size_t>(end)] - prefix[static_cast<std::size_t>(first)];
    if (stage == 0) c += before_cost;
    if (stage == stages - 1) c += after_cost;
    return c;
  };
  // best[s][e]: the least possible costliest stage when stages 0 … s hold layers [0, e).
  const double infinity = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(
      static_cast<std::size_t>(stages),
      std::vector<double>(static_cast<std::size_t>(n + 1), infinity));
  std::vector<std::vector<std::int64_t>> cut(
      static_cast<std::size_t>(stages), std::vector<std::int64_t>(static_cast<std::size_t>(n + 1)));
  for (std::int64_t e = 1; e <= n; ++e) best[0][static_cast<std::size_t>(e)] = cost_of(0, e, 0);
  for (int s = 1; s < stages; ++s)
    for (std::int64_t e = s + 1; e <= n; ++e)
      for (std::int64_t b = s; b < e; ++b) {
        const double c = std::max(
            best[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(b)], cost_of(b, e, s));
        if (c < best[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)]) {
          best[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)] = c;
          cut[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)] = b;
        }
      }
  std::vector<StageLayers> ranges(static_cast<std::size_t>(stages));
  std::int64_t end = n;
  for (int s = stages - 1; s >= 0; --s) {
    const std::int64_t first =
        s == 0 ? 0 : cut[static_cast<std::size_t>(s)][static_cast<std::size_t>(end)];
    ranges[static_cast<std::size_t>(s)] = {first, end};
    end = first;
  }
  return ranges;
}

std::vector<PipelineAction> one_f_one_b(int stage, int stages, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw Error(ErrorKind::Internal, "one_f_one_b: stage " + std::to_string(stage) + " of " +
                                         std::to_string(stages) + ", " +
                                         std::to_string(micro_batches) + " micro-batches");
  const int warm_up = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineAction> actions;
  int forward = 0, backward = 0;
  for (; forward < warm_up; ++forward) actions.push_back({PipelineAction::Forward, forward});
  for (; forward < micro_batches; ++forward, ++backward) {
    actions.push_back({PipelineAction::Forward, forward});
    actions.push_back({PipelineAction::Backward, backward});
  }
  for (; backward < micro_batches; ++backward)
    actions.push_back({PipelineAction::Backward, backward});
  return actions;
}

std::vector<PipelineAction> interleaved_one_f_one_b(int stage, int stages, int chunks,
                                                    int micro_batches) {
  if (chunks <= 1) return one_f_one_b(stage, stages, micro_batches);
  if (stages < 1 || stage < 0 || stage >= stages)
    throw Error(ErrorKind::Internal, "interleaved_one_f_one_b: stage " + std::to_string(stage) +
                                         " of " + std::to_string(stages));
  if (micro_batches < stages || micro_batches % stages != 0)
    throw_invalid("the interleaved pipeline schedule runs micro-batches in groups of pp_size (" +
                      std::to_string(stages) + "); training.gradient_accumulation is " +
                      std::to_string(micro_batches),
                  "set gradient_accumulation to a multiple of " + std::to_string(stages) +
                      ", or pp_chunks to 1");
  const int total = micro_batches * chunks;
  // The k-th forward (backward) of this stage: groups of `stages` micro-batches pass chunk 0,
  // then chunk 1, …; backwards walk the chunks the other way.
  const auto action = [&](PipelineAction::Kind kind, int k) {
    const int in_group = k % (stages * chunks);
    int chunk = in_group / stages;
    if (kind == PipelineAction::Backward) chunk = chunks - 1 - chunk;
    const int micro_batch = (k / (stages * chunks)) * stages + k % stages;
    return PipelineAction{kind, micro_batch, chunk};
  };
  const int warm_up = micro_batches == stages
                          ? total
                          : std::min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages);
  std::vector<PipelineAction> actions;
  for (int k = 0; k < warm_up; ++k) actions.push_back(action(PipelineAction::Forward, k));
  for (int k = 0; k < total - warm_up; ++k) {
    actions.push_back(action(PipelineAction::Forward, warm_up + k));
    actions.push_back(action(PipelineAction::Backward, k));
  }
  for (int k = total - warm_up; k < total; ++k)
    actions.push_back(action(PipelineAction::Backward, k));
  return actions;
}

int most_activations_held(const std::vector<PipelineAction>& actions) {
  int held = 0, most = 0;
  for (const PipelineAction& a : actions) {
    held += a.kind == PipelineAction::Forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

double simulate_pipeline(int stages, int micro_batches, double forward, double backward,
                         std::vector<double>* idle, int chunks) {
  const auto virtual_stages = static_cast<std::size_t>(stages * chunks);
  return simulate_pipeline(stages, micro_batches, std::vector<double>(virtual_stages, forward),
                           std::vector<double>(virtual_stages, backward), idle, chunks);
}

double simulate_pipeline(int stages, int micro_batches, const std::vector<double>& forward,
                         const std::vector<double>& backward, std::vector<double>* idle,
                         int chunks) {
  if (forward.size() != static_cast<std::size_t>(stages * chunks) ||
      backward.size() != forward.size())
    throw Error(ErrorKind::Internal, "simulate_pipeline: one time per virtual stage expected");
  std::vector<std::vector<PipelineAction>> schedules;
  for (int s = 0; s < stages; ++s)
    schedules.push_back(interleaved_one_f_one_b(s, stages, chunks, micro_batches));
  const int virtual_stages = stages * chunks;
  // done_forward[g][m] / done_backward[g][m]: when virtual stage g (chunk · stages + stage)
  // finished that action (−1: not yet).
  std::vector<std::vector<double>> done_forward(
      static_cast<std::size_t>(virtual_stages),
      std::vector<double>(static_cast<std::size_t>(micro_batches), -1));
  std::vector<std::vector<double>> done_backward = done_forward;
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  std::vector<double> free_at(static_cast<std::size_t>(stages), 0.0), busy(free_at);
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int s = 0; s < stages; ++s) {
      const auto su = static_cast<std::size_t>(s);
      while (next[su] < schedules[su].size()) {
        const PipelineAction a = schedules[su][next[su]];
        const auto m = static_cast<std::size_t>(a.micro_batch);
        const int g = a.chunk * stages + s;
        const auto gu = static_cast<std::size_t>(g);
        double ready = 0.0;
        if (a.kind == PipelineAction::Forward) {
          if (g > 0) ready = done_forward[gu - 1][m];
        } else {
          ready = g + 1 < virtual_stages ? done_backward[gu + 1][m] : done_forward[gu][m];
        }
        if (ready < 0) break;  // waits on another stage
        const double start = std::max(ready, free_at[su]);
        const double length = a.kind == PipelineAction::Forward ? forward[gu] : backward[gu];
        free_at[su] = start + length;
        busy[su] += length;
        (a.kind == PipelineAction::Forward ? done_forward : done_backward)[gu][m] = free_at[su];
        ++next[su];
        progressed = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s)
    if (next[static_cast<std::size_t>(s)] != schedules[static_cast<std::size_t>(s)].size())
      throw Error(ErrorKind::Internal, "simulate_pipeline: the schedules deadlock");
  const double makespan = *std::max_element(free_at.begin(), free_at.end());
  if (idle != nullptr) {
    idle->clear();
    for (double b : busy) idle->push_back(makespan - b);
  }
  return makespan;
}

double pipeline_bubble_fraction(int stages, int micro_batches, int chunks) {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * micro_batches + stages - 1);
}

std::string describe_stages(const std::vector<StageLayers>& stages) {
  std::string text;
  for (const StageLayers& s : stages) {
    if (!text.empty()) text.append(" | ");
    text.append("layers ").append(std::to_string(s.first));
    if (s.end - s.first > 1) text.append("-").append(std::to_string(s.end - 1));
  }
  return text;
}

}  // namespace tessera::parallel
