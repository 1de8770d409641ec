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
// manifest.json last (see checkpoint.h). Several processes: rank r > 0 adds
// rng_state-rank<r>.safetensors; a plugin whose state is sharded (Plugin::state_layout) has each
// rank write model-rank<r>.safetensors and optimizer-rank<r>.safetensors instead of the two
// files above; the manifest records world_size and state_layout.
//
// Activation checkpointing (training.activation_checkpointing): the trainer sets the model's
// layer_wrapper to train::checkpointed, so each layer keeps only its input and is recomputed in
// backward (same losses and gradients, less activation memory, about one more forward per step).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "train/batch.h"
#include "train/checkpoint.h"
#include "train/lora.h"
#include "train/plugin.h"
#include "train/preference.h"
#include "train/trainer_events.h"

namespace tessera::train {

// The loop's settings; the defaults and meanings are the job spec's `training` section
// (docs/job-spec.md), which the runner copies here. The batch size is the BatchSource's.
struct TrainingOptions {
  std::optional<std::int64_t> steps;  // exactly one of steps / epochs (neither: one epoch)
  std::optional<double> epochs;
  std::int64_t gradient_accumulation = 1;
  double learning_rate = 2e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  std::string schedule = "linear";  // constant | linear | cosine
  std::int64_t warmup_steps = 0;
  double max_grad_norm = 1.0;  // 0: no clipping
  std::uint64_t seed = 42;
  std::int64_t eval_every = 0;  // 0: only at the end when there is an eval source
  std::int64_t save_every = 0;  // 0: only at the end
  std::int64_t keep_last = 2;
  std::int64_t log_every = 1;
  bool activation_checkpointing = false;
};

// The job spec's `method` section.
struct MethodOptions {
  std::string type = "full";  // full | lora
  std::int64_t lora_rank = 8;
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_targets;  // empty: the family's default (attention projections)
  // LoRA on a quantized base (QLoRA): "nf4", "fp4" or "int8"; empty: the base stays dense (or
  // as the checkpoint stores it: a bitsandbytes checkpoint's base is quantized already, and
  // `quantize`, when set, must name its format).
  std::string quantize;
  bool double_quant = false;  // 4-bit: the absmax double-quantized as well
  // Preference tuning (train/preference.h): every batch holds pairs, chosen rows first.
  std::optional<PreferenceOptions> preference;
};

struct TrainerOptions {
  TrainingOptions training;
  MethodOptions method;
  std::string precision = "fp32";
  std::string plugin = "single";  // a name in train/plugin_registry.h (never "auto")
  std::string device = "auto";    // PluginOptions::device
  nlohmann::json strategy_options = nlohmann::json::object();  // PluginOptions::strategy_options
  std::filesystem::path output_dir;             // checkpoints go here (required to save)
  std::optional<std::filesystem::path> resume;  // run folder or checkpoint folder
  std::string base_model_name;                  // written into adapter_config.json
  // Stop (with a checkpoint) once this many optimizer steps are done in total, as if
  // interrupted; the run can be resumed to the full length. For tests and Ctrl-C-like stops.
  std::optional<std::int64_t> stop_after_steps;
  // Initial adapter weights (PEFT adapter_model.safetensors), e.g. to compare with peft.
  std::optional<std::filesystem::path> lora_init;
  // Set when the model's parameters have no values yet (model::DeferredWeights): the plugin
  // reads them into its own storage, or the trainer loads them before preparing the plugin.
  std::shared_ptr<const model::DeferredWeights> deferred_weights;
  // Preference objectives with a reference (DPO, IPO): the frozen reference model, loaded in
  // float32 and not yet placed (the trainer moves it to the plugin's device in the compute
  // dtype). None with LoRA: the reference is then the model with its adapters off.
  std::shared_ptr<model::PretrainedModel> reference_model;
  // This process among the job's (PluginOptions::process). With several, every rank runs the
  // same loop: rank r trains on micro-batch r of every world_size (ShardedBatchSource), the
  // reported loss and evaluations are means over the ranks, throughput and memory are gathered
  // per rank, a stop is agreed on by all, checkpoints are written together (checkpoint.h), and
  // each rank draws from its own random stream (seed + rank) after the model is prepared.
  ProcessContext process;
};

// A training step ran out of device memory (exit 2): the message names the device, what it was
// allocating, what it held and the checkpoint saved; `needed`, the bytes the device would have
// held at least (0: not known), lets the runner plan the change that fits.
class StepOutOfDeviceMemory : public Error {
 public:
  StepOutOfDeviceMemory(std::string message, std::string hint, std::uint64_t needed)
      : Error(ErrorKind::OutOfMemory, std::move(message), std::move(hint)), needed_(needed) {}
  std::uint64_t needed() const { return needed_; }

 private:
  std::uint64_t needed_ = 0;
};

struct TrainResult {
  std::string status;  // completed | stopped
  std::int64_t start_step = 0;
  std::int64_t steps_done = 0;  // optimizer steps done in total (including before a resume)
  std::int64_t total_steps = 0;
  std::vector<double> losses;  // per step of this process, from start_step
  std::vector<double> grad_norms;
  std::vector<double> lrs;
  std::vector<PreferenceMetrics> preference;  // per step, preference tuning only
  std::vector<EvalResult> evals;
  std::optional<std::filesystem::path> last_checkpoint;
};

class Trainer {
 public:
  // `model` is loaded (float32), or built with its weights in options.deferred_weights, and not
  // yet prepared; the trainer applies LoRA when asked,
  // hands the model to the plugin, and keeps no parameter storage of its own.
  // The plugin comes from the registry (train/plugin_registry.h): register the plugins first.
  // `events` (may be null) must outlive the trainer.
  Trainer(std::shared_ptr<model::PretrainedModel> model, TrainerOptions options,
          TrainerEvents* events = nullptr);
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
  void quantize_base();
  // A batch as the model's input on the plugin's device (labels: the input ids when absent).
  model::ForwardInput input_of(const Batch& batch) const;
  // The dropout stream of a micro-batch whose first row is `first_row` of step `step`'s global
  // batch (model/dropout.h).
  model::DropoutStream dropout_stream(std::int64_t step, std::int64_t first_row) const;
  model::ForwardOutput forward_batch(const Batch& batch);
  // Forward and backward of one micro-batch, its loss × `multiplier` (its share of the step);
  // returns its loss (float64, a scalar where the model computes, not read back).
  // `first_row`: the global row of its first example in the step's global batch (dropout masks
  // are keyed by it, model/dropout.h).
  torch::Tensor train_micro_batch(const Batch& batch, double multiplier, bool last_micro_batch,
                                  std::int64_t step, std::int64_t first_row);
  // What a batch's loss is the mean over, counted on the host: a causal LM's label tokens (the
  // positions whose next token counts), a preference or classification loss's rows.
  double loss_targets(const Batch& batch) const;
  // Preference tuning: the objective of a batch of pairs (train/preference.h), from the policy's
  // forward and, for DPO / IPO, the reference's (without gradients).
  PreferenceBatchLoss preference_batch_loss(const Batch& batch);
  PreferenceBatchLoss kto_batch_loss(const Batch& batch, const model::ForwardInput& input,
                                     const torch::Tensor& labels);
  SequenceLogProbs reference_log_probs(const model::ForwardInput& input,
                                       const torch::Tensor& labels);
  void prepare_preference();
  // The preference metrics of `sums` gathered over the data-parallel ranks (a collective).
  PreferenceMetrics preference_metrics(const PreferenceSums& sums);
  void emit_eval(const EvalResult& result);
  std::filesystem::path save_checkpoint(std::int64_t step, const BatchSource& train,
                                        std::int64_t total_steps);
  std::int64_t restore(BatchSource& train, std::int64_t total_steps);
  void emit_memory();
  // The device ran out of memory in step `step` + 1: before its update (`in_update` false)
  // saves step `step` as it was (one process); in it, names the newest checkpoint saved before.
  // Throws StepOutOfDeviceMemory (exit 2) with `what`, the device's memory by category and
  // `hint`; `needed`: the bytes the device would have held (0: unknown).
  [[noreturn]] void out_of_device_memory(const std::string& what, const std::string& hint,
                                         std::uint64_t needed, std::int64_t step,
                                         const DataPosition& step_start,
                                         const torch::Tensor& cpu_rng,
                                         const torch::Tensor& device_rng, BatchSource& train,
                                         std::int64_t total_steps, bool in_update = false);
  // Several processes: each rank's `values` (the same count on every rank), rank after rank, over
  // every rank of the job (`data_only`: over this rank's data-parallel group, whose ranks read
  // different batches); one process: `values`.
  std::vector<double> gather(const std::vector<double>& values, bool data_only = false);
  // The group of every rank of the job (the data group when no runtime is given).
  dist::ProcessGroup& world_group() const;
  CheckpointRanks checkpoint_ranks();
  bool distributed() const { return options_.process.world_size > 1; }
  // This rank among the data-parallel ranks, and their number: ranks that differ only in their
  // tensor or pipeline coordinates read the same micro-batches.
  int data_rank() const;
  int data_ranks() const;
  // Sequences (rows) an optimizer step of `train` trains on every data-parallel rank together.
  std::int64_t sequences_per_step(const BatchSource& train) const;
  // hybrid's mesh (tensor and pipeline sizes), for the events to name each rank's place.
  std::optional<MeshShape> mesh_shape() const;
  // The disk tier's traffic counters at the last memory report (rates are deltas).
  struct DiskSample {
    std::chrono::steady_clock::time_point at;
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
  };
  std::optional<DiskSample> last_disk_report_;

  std::shared_ptr<model::PretrainedModel> model_;
  TrainerOptions options_;
  TrainerEvents* events_;
  std::unique_ptr<Plugin> plugin_;
  std::unique_ptr<LoraModel> lora_;
  std::shared_ptr<model::PretrainedModel> reference_;  // placed; see TrainerOptions
  PreferenceSums step_preference_;  // this rank's sums over the current step's micro-batches
};

// Process resident set size in bytes (core::process_rss: /proc/self/statm; 0 when unavailable).
std::uint64_t process_rss_bytes();
// Memory in use on the machine (MemTotal - MemAvailable of /proc/meminfo), if readable.
std::optional<std::uint64_t> system_memory_used_bytes();

}  // namespace tessera::train
