#pragma once
// What the trainer reports while it runs, as typed callbacks. The trainer knows nothing of the
// job layer's event stream (shared/DESIGN.md: train does not include job); the runner turns
// these into `metric`, `memory`, `checkpoint`, `progress` and `log` events
// (runner/trainer_event_writer.h). Every method does nothing unless overridden.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dist/traffic.h"
#include "train/plugin.h"

namespace tessera::train {

// Preference tuning's figures for a step or an evaluation (train/preference.h): means over
// every pair of every rank.
struct PreferenceMetrics {
  std::int64_t pairs = 0;        // paired objectives
  std::int64_t desirable = 0;    // KTO: the desirable examples ("chosen")
  std::int64_t undesirable = 0;  // ... and the undesirable ones ("rejected")
  double reward_chosen = 0.0;    // mean over the chosen / desirable rows
  double reward_rejected = 0.0;
  double margin = 0.0;  // reward_chosen − reward_rejected
  // Pairs: the share whose chosen reward is above the rejected one.
  std::optional<double> accuracy;
  double log_prob_chosen = 0.0;
  double log_prob_rejected = 0.0;
  std::optional<double> kl;  // KTO: the mean of the batches' KL estimates
};

struct EvalResult {
  std::int64_t step = 0;
  double loss = 0.0;
  std::optional<double> perplexity;  // causal LM: exp(loss)
  std::optional<double> accuracy;    // classification: share of predicted labels that are right
  std::optional<PreferenceMetrics> preference;  // preference tuning
  double seconds = 0.0;                         // this rank's wall time for it
  std::int64_t batches = 0;  // the forwards this rank ran (its share of the batches)
};

// One rank's share of a step, in a job of several processes.
// hybrid: the mesh its ranks form (dp × pp × tp, tp innermost), so that each rank's figures
// name its place: tensor rank r % tp, pipeline stage (r / tp) % pp, data-parallel rank
// r / (tp · pp).
struct MeshShape {
  int tp = 1;
  int pp = 1;
};

struct RankStep {
  int rank = 0;
  double loss = 0.0;          // this rank's micro-batch losses, weighted by their targets
  double targets = 0.0;       // what that loss is the mean over: label tokens (rows for
                              // preference and classification), its weight in the job's loss
  double tokens_per_s = 0.0;  // this rank's tokens over its own step time
  // A plugin that runs the micro-batches itself (pipeline stages): this rank's step time and
  // the part of it spent waiting for its neighbouring stages (the pipeline's bubble).
  std::optional<double> step_s;
  std::optional<double> pipeline_idle_s;
};

// One optimizer step (reported every training.log_every steps and at the last one).
struct StepReport {
  std::int64_t step = 0;  // optimizer steps done in total
  double loss = 0.0;      // mean of the micro-batch losses (over every rank's)
  double lr = 0.0;
  double grad_norm = 0.0;       // before clipping
  double tokens_per_s = 0.0;    // every rank's tokens over the slowest rank's step time
  std::vector<RankStep> ranks;  // several processes only: each rank's, gathered by a collective
  // Several processes only: what this rank handed to c10d on the data-parallel group during
  // this step (its micro-batches, the update and the step's own gather of losses and times);
  // dist/traffic.h says what is counted.
  std::optional<dist::Traffic> traffic;
  // Tensor parallelism only (hybrid): the same on this rank's tensor-parallel group.
  std::optional<dist::Traffic> tensor_traffic;
  // hybrid with pipeline stages: the same for this rank's pipeline group (the stages' sends).
  std::optional<dist::Traffic> pipeline_traffic;
  std::optional<MeshShape> mesh;                // hybrid: each rank's coordinates
  std::optional<PreferenceMetrics> preference;  // preference tuning
};

// Memory of the training process: on the plugin's device when it is an accelerator, else the
// process's resident set on the host.
struct MemoryReport {
  bool on_device = false;  // an accelerator's memory (else host memory)
  bool on_disk = false;    // the plugin's disk tier (then `device` is its folder)
  std::string device;      // the plugin's device, e.g. "cpu", "cuda:0"
  std::uint64_t used = 0;
  std::uint64_t reserved = 0;
  MemoryByCategory by_category;
  std::uint64_t activations_other = 0;       // the rest of the resident set
  std::optional<std::uint64_t> system_used;  // host only: the whole machine's use
  // A GPU only (the CUDA allocator and the driver): the peak of `used` since the process
  // started, the card's memory and what is free on it (every process counted).
  std::optional<std::uint64_t> peak;
  std::optional<std::uint64_t> total;
  std::optional<std::uint64_t> free;
  // A plugin's device tier only (gemini's chunks): chunk traffic between host and device since
  // the run started, and whether the device is the tests' simulated one.
  std::optional<std::uint64_t> bytes_to_device;
  std::optional<std::uint64_t> bytes_to_host;
  bool simulated = false;
  // A plugin's device tier only: the bytes its chunks may take there (device_budget, or what the
  // GPU had free when the run started).
  std::optional<std::uint64_t> budget;
  // Disk only: chunk traffic since the run started, and its rate since the last report.
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  double read_bytes_per_s = 0.0;
  double written_bytes_per_s = 0.0;
  // Several processes only: every rank's own report, rank order (a disk report: each rank's own
  // tier, `used` and `by_category`); the fields above are this rank's (rank 0's in the stream).
  struct Rank {
    int rank = 0;
    std::string host;
    std::uint64_t used = 0;
    MemoryByCategory by_category;
    std::uint64_t activations_other = 0;
  };
  std::vector<Rank> ranks;
  std::optional<MeshShape> mesh;  // hybrid: each rank's coordinates
};

class TrainerEvents {
 public:
  virtual ~TrainerEvents() = default;
  virtual void on_step(const StepReport& /*report*/) {}
  // Every optimizer step (whatever log_every says): its wall time, for the runner to record
  // this machine's measured step time (plan/step_times.h).
  virtual void on_step_time(std::int64_t /*step*/, double /*seconds*/) {}
  virtual void on_eval(const EvalResult& /*result*/) {}
  virtual void on_memory(const MemoryReport& /*report*/) {}
  virtual void on_checkpoint(std::int64_t /*step*/, const std::filesystem::path& /*path*/) {}
  // phase: train | eval | save; eta_seconds for train (the evaluations to come included) and eval.
  virtual void on_progress(const std::string& /*phase*/, std::int64_t /*done*/,
                           std::int64_t /*total*/, std::optional<double> /*eta_seconds*/) {}
  // level: info | warning.
  virtual void on_log(const std::string& /*level*/, const std::string& /*message*/) {}
};

}  // namespace tessera::train
