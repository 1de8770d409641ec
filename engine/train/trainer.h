#pragma once
// The training loop: micro-batches with gradient accumulation, AdamW through a Plugin, LR
// schedule with warmup, clipping, evaluation, events, crash-safe checkpoints and exact resume.
//
// Gradient accumulation: each micro-batch's loss (the model's mean token loss) is scaled by
// 1/gradient_accumulation before backward, so the step's gradient is the mean of the
// micro-batch gradients and the reported loss is the mean of the micro-batch losses (as the
// transformers Trainer does for models that do not take num_items_in_batch).
//
// Checkpoint contents (checkpoint-<step>/): model.safetensors (full: every trainable weight,
// float32 masters, HF names) or adapter_model.safetensors + adapter_config.json (LoRA, PEFT
// format); optimizer.safetensors (AdamW m and v); rng_state.safetensors (torch's CPU
// generator); trainer_state.json (step, data position and seed, schedule, plugin state);
// manifest.json last (see checkpoint.h).
//
// Activation checkpointing (training.activation_checkpointing): the trainer sets the model's
// layer_wrapper to train::checkpointed, so each layer keeps only its input and is recomputed in
// backward (same losses and gradients, less activation memory, about one more forward per step).
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "job/events.h"
#include "job/job_spec.h"
#include "model/model.h"
#include "train/batch.h"
#include "train/lora.h"
#include "train/plugin.h"

namespace tessera::train {

struct TrainerOptions {
  job::TrainingSpec training;
  job::MethodSpec method;
  std::string precision = "fp32";
  std::string plugin = "single";
  std::string device = "auto";
  std::filesystem::path output_dir;             // checkpoints go here (required to save)
  std::optional<std::filesystem::path> resume;  // run folder or checkpoint folder
  std::string base_model_name;                  // written into adapter_config.json
  // Stop (with a checkpoint) once this many optimizer steps are done in total, as if
  // interrupted; the run can be resumed to the full length. For tests and Ctrl-C-like stops.
  std::optional<std::int64_t> stop_after_steps;
  // Initial adapter weights (PEFT adapter_model.safetensors), e.g. to compare with peft.
  std::optional<std::filesystem::path> lora_init;
};

struct EvalResult {
  std::int64_t step = 0;
  double loss = 0.0;
  std::optional<double> perplexity;  // causal LM: exp(loss)
  std::optional<double> accuracy;    // classification: share of predicted labels that are right
};

struct TrainResult {
  std::string status;  // completed | stopped
  std::int64_t start_step = 0;
  std::int64_t steps_done = 0;  // optimizer steps done in total (including before a resume)
  std::int64_t total_steps = 0;
  std::vector<double> losses;  // per step of this process, from start_step
  std::vector<double> grad_norms;
  std::vector<double> lrs;
  std::vector<EvalResult> evals;
  std::optional<std::filesystem::path> last_checkpoint;
};

class Trainer {
 public:
  // `model` is loaded (float32) and not yet prepared; the trainer applies LoRA when asked,
  // hands the model to the plugin, and keeps no parameter storage of its own.
  Trainer(std::shared_ptr<model::PretrainedModel> model, TrainerOptions options,
          job::EventSink* events = nullptr);
  ~Trainer();

  // Runs to the configured number of steps (or epochs over `train`), evaluating on `eval` when
  // given. `stop` (may be null) is polled after every step: when set, the trainer writes a
  // checkpoint and returns with status "stopped".
  TrainResult train(BatchSource& train, BatchSource* eval = nullptr,
                    const std::atomic<bool>* stop = nullptr);

  // Mean loss over one pass of `source` (from its start; its position is restored).
  EvalResult evaluate(BatchSource& source);

  Plugin& plugin() { return *plugin_; }
  LoraModel* lora() { return lora_.get(); }
  model::PretrainedModel& model() { return *model_; }
  std::int64_t total_steps_for(const BatchSource& train) const;

 private:
  model::ForwardOutput forward_batch(const Batch& batch);
  double micro_batch_loss(const Batch& batch, bool backward);
  void emit_eval(const EvalResult& result);
  std::filesystem::path save_checkpoint(std::int64_t step, const BatchSource& train,
                                        std::int64_t total_steps);
  std::int64_t restore(BatchSource& train, std::int64_t total_steps);
  void emit_memory();

  std::shared_ptr<model::PretrainedModel> model_;
  TrainerOptions options_;
  job::EventSink* events_;
  std::unique_ptr<Plugin> plugin_;
  std::unique_ptr<LoraModel> lora_;
};

// Process resident set size in bytes, from /proc/self/statm (0 when unavailable).
std::uint64_t process_rss_bytes();
// Memory in use on the machine (MemTotal - MemAvailable of /proc/meminfo), if readable.
std::optional<std::uint64_t> system_memory_used_bytes();

}  // namespace tessera::train
