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
  // Strategy "auto": plan against this much host memory instead of what is free (what-if
  // runs and tests; the plan event marks it simulated).
  std::optional<std::uint64_t> simulate_host_memory;
};

// Throws tessera::Error for bad input (naming the file/field) and failures; the caller turns
// that into an `error` event and an exit code. With strategy "auto" the run trains with the
// planner's settings (see plan/planner.h) and fails before loading anything when no setting
// fits.
RunOutcome run_job(const job::JobSpec& spec, job::EventSink& events,
                   const RunOptions& options = {});

}  // namespace tessera::runner
