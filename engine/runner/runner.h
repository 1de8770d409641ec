#pragma once
// Runs a job spec end to end: model and tokenizer, dataset (format detection, tokenization,
// split), training through a plugin, and the final HuggingFace export — reporting through
// the event stream. `tessera-cli run` / `finetune` and the studio (through the CLI) use it.
//
// The run folder (`output.dir`):
//   job.json             the spec as run (every default written out)
//   checkpoint-<step>/   crash-safe checkpoints (see engine/train/checkpoint.h)
//   model/               the final model, a HuggingFace folder (LoRA: merged into the base)
//   adapter/             LoRA only: the adapter in PEFT format
//   plan.json            strategy "auto" only: the plan the run follows (reused on resume, so a
//                        resumed run keeps its method, precision and micro-batch)
#include <atomic>
#include <filesystem>
#include <optional>
#include <string>

#include "job/events.h"
#include "job/job_spec.h"

namespace tessera::runner {

struct RunOutcome {
  std::string status;  // completed | stopped
  std::int64_t steps_done = 0;
  std::int64_t total_steps = 0;
  std::optional<double> final_loss;
  std::optional<double> final_eval_loss;
  std::optional<std::filesystem::path> model_dir;    // exported model (completed runs)
  std::optional<std::filesystem::path> adapter_dir;  // LoRA adapter (completed runs)
  std::optional<std::filesystem::path> last_checkpoint;
};

struct RunOptions {
  // Polled after every step: when set, the run writes a checkpoint and returns "stopped".
  const std::atomic<bool>* stop = nullptr;
  // Set by the run while its training loop runs, where a stop request finishes the step and
  // checkpoints; outside it (loading, reading and tokenizing the data, the export) there is
  // nothing to save yet or left to lose, so the caller may end the process at once.
  std::atomic<bool>* stopping_at_step_end = nullptr;
  // Strategy "auto": plan against this much host memory instead of what is free (what-if
  // runs and tests; the plan event marks it simulated).
  std::optional<std::uint64_t> simulate_host_memory;
};

// Throws tessera::Error (Unsupported) when `spec`'s strategy cannot run as `world_size`
// processes: "auto" (the planner plans one process) or a plugin that does not distribute
// (train::Plugin::runs_distributed), naming the strategies that do; and hybrid's check_hybrid
// (for one process too).
void check_processes(const job::JobSpec& spec, int world_size);
// strategy hybrid on `world_size` processes: tp_size divides them, and the model (when its
// folder is here) has a tensor-parallel plan whose sizes tp_size divides. Throws
// tessera::Error naming the field, the numbers and the sizes that would work.
void check_hybrid(const job::JobSpec& spec, int world_size);
// A preference reference the spec names (method.preference.reference): a model folder whose
// vocabulary is the trained model's (`model_dir`, when it is here). Throws InvalidInput naming
// the field; the run checks it before loading, and so does `tessera-cli plan`.
void check_preference_reference(const job::JobSpec& spec, const std::filesystem::path& model_dir);

// Several processes (torchrun's WORLD_SIZE etc. set; engine/dist/README.md): every rank calls
// run_job with the same spec. Each joins the job (rendezvous; a bad variable is an error naming
// it), trains its share of every step (train/trainer.h) and writes its part of each checkpoint;
// rank 0 alone writes job.json, plan.json and the export, and its `events` carry every rank's
// loss, throughput and memory. The caller opens `events` on rank 0 only.
//
// Throws tessera::Error for bad input (naming the file/field) and failures; the caller turns
// that into an `error` event and an exit code. With strategy "auto" the run trains with the
// planner's settings (see plan/planner.h) and fails before loading anything when no setting
// fits.
RunOutcome run_job(const job::JobSpec& spec, job::EventSink& events,
                   const RunOptions& options = {});

}  // namespace tessera::runner
