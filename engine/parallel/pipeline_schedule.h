#pragma once
// Pipeline parallelism's arithmetic, torch-free: which layers each stage holds (balanced by cost,
// not by count: the head's vocabulary-wide matrix weighs as much as several layers) and in what
// order a stage runs its micro-batches' forwards and backwards (1F1B: PipeDream-flush, as
// Megatron and Colossal-AI schedule it). The plugin that runs them is plugins/hybrid.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::parallel {

struct StageLayers {
  std::int64_t first = 0;  // layers [first, end)
  std::int64_t end = 0;
};

// Splits layers 0 … n-1 (n = layer_costs.size()) into `stages` contiguous ranges of at least one
// layer each, the first stage also bearing `before_cost` (the embedding) and the last
// `after_cost` (final norm, head and loss), so that the costliest stage is as cheap as it can be
// (ties: the earlier boundary). Throws tessera::Error (InvalidInput) when stages < 1 or > n.
std::vector<StageLayers> balance_stages(const std::vector<double>& layer_costs, double before_cost,
                                        double after_cost, int stages);

struct PipelineAction {
  enum Kind { Forward, Backward };
  Kind kind = Forward;
  int micro_batch = 0;
  // Interleaved schedule: which of the stage's model chunks (virtual stage chunk · stages +
  // stage); 0 in plain 1F1B.
  int chunk = 0;
  bool operator==(const PipelineAction&) const = default;
};

// Stage `stage` of `stages` in the 1F1B schedule over `micro_batches`: min(stages - stage - 1, m)
// warm-up forwards, then one forward and one backward in turn, then the remaining backwards.
// Each stage holds at most stages - stage micro-batches' activations (not m, as GPipe's
// all-forwards-first does). Backwards run in micro-batch order.
std::vector<PipelineAction> one_f_one_b(int stage, int stages, int micro_batches);

// The interleaved 1F1B schedule (Megatron-LM's): each stage holds `chunks` model chunks, chunk c
// of stage s being virtual stage c · stages + s of stages · chunks, so a micro-batch passes every
// stage `chunks` times and the bubble shrinks by that factor: (stages − 1) / (chunks ·
// micro_batches + stages − 1) of the step. micro_batches must be a multiple of stages (throws
// tessera::Error InvalidInput naming gradient_accumulation otherwise). chunks = 1 is
// one_f_one_b.
std::vector<PipelineAction> interleaved_one_f_one_b(int stage, int stages, int chunks,
                                                    int micro_batches);

// The most micro-batches (of one chunk each) whose forward has run and backward not yet, over a
// stage's actions: the activations the stage holds at its peak (the planner's figure).
int most_activations_held(const std::vector<PipelineAction>& actions);

// The schedule's idle share per stage when every forward takes `forward` and every backward
// `backward` time units and messages are instant: the textbook bubble (stages − 1) /
// (micro_batches + stages − 1) when backward = forward… computed by running the schedules of all
// stages against each other (an action starts once the stage is free and its input has
// arrived). Returns the makespan; `idle` (optional) gets each stage's idle time.
// With `chunks` above 1 the interleaved schedule, forward and backward being one chunk's.
double simulate_pipeline(int stages, int micro_batches, double forward, double backward,
                         std::vector<double>* idle = nullptr, int chunks = 1);
// The same with each virtual stage's own times (indexed by chunk · stages + stage), as the
// planner costs stages of unequal work: a lighter stage's fill and drain cost its own time, and
// the heaviest stage paces the steady state.
double simulate_pipeline(int stages, int micro_batches, const std::vector<double>& forward,
                         const std::vector<double>& backward, std::vector<double>* idle = nullptr,
                         int chunks = 1);

// (stages − 1) / (chunks · micro_batches + stages − 1): the bubble fraction a balanced 1F1B
// pipeline leaves (interleaved over `chunks` chunks per stage).
double pipeline_bubble_fraction(int stages, int micro_batches, int chunks = 1);

// "layers 0-3 | 4-7" for messages and the plan.
std::string describe_stages(const std::vector<StageLayers>& stages);

}  // namespace tessera::parallel
