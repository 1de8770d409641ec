#pragma once
// The planner: a per-category memory cost model of OUR single-process trainer (weights,
// gradients, optimizer state, activations, runtime) and a search over what the engine can do
// (full or LoRA, micro-batch with gradient accumulation, activation checkpointing, bf16) for
// the settings that fit the hardware profile. Torch-free.
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hf/config.h"
#include "hf/model_folder.h"
#include "job/job_spec.h"
#include "plan/hybrid_cost.h"
#include "plan/profile.h"
#include "plan/settings.h"
#include "plan/step_times.h"

namespace tessera::plan {

// Resident set of a training process beyond what the categories hold: LibTorch and its
// kernels' workspaces, the tokenizer and the data. Fitted on this build from measured peaks
// of `tessera-cli run` (tests/parity/test_plan_estimate.py checks the total within 25%):
// the intercept of peak RSS against micro-batch, minus weights, gradients and optimizer state.
// A process without the CUDA module (engine/cuda/runtime.h); where it is loaded, LibTorch's CUDA
// libraries add about 360 MiB more (measured on a one-layer run: 177 MiB without, 532 with).
// Refitted when the module came (560 MiB before), on an AMX machine: fp32 runs and gemini's
// ranks alone fit 200 MiB, a bf16 LoRA run 300 (bf16 holds more than the categories count);
// 260 kept test_plan_estimate within 25% and test_plan_ranks within 30%, with thin margins.
// Refitted when LibTorch's blocks from 1 MiB came from the block cache (train/cpu_block_cache.h,
// session 58): the heap then kept less, and at 260 test_plan_estimate's ten runs read 1.00-1.23
// of their measured peaks (0.84-1.14 before); at 220, 0.92-1.13.
inline constexpr std::uint64_t kRuntimeBaselineBytes = 220ull << 20;
// No run peaks below this: a run of a one-layer model measured 177 MiB (LibTorch's thread
// pools and the export's self-check), whatever the categories add up to.
inline constexpr std::uint64_t kRuntimeFloorBytes = 180ull << 20;
// Backward temporaries (each op's input gradients alive next to the saved tensors) and
// allocator slack on top of the saved activations. Measured as the slope of peak RSS from 128 to
// 512 tokens a sequence (batch 8; two llamas of 4 and 6 layers, full and LoRA): 0.82-0.92 of the
// saved tensors counted, so the 1.25 fitted per sample at 128 tokens put the plan at 1.24-1.30x
// the peak at 512; 1.1 keeps both lengths within -5% to +19%.
inline constexpr double kActivationOverhead = 1.1;
// A blocking collective of a tensor group costs, besides its bytes and the link's latency, the
// wait for the later of its ranks, which every op between two collectives' jitter adds to: 2 ms
// a call, fitted on hybrid tp 2 with one thread a rank on a 2-core AMD EPYC (85 calls a step cost
// 0.17 s more than their bytes and latency at 128 tokens a sequence, 0.16 s at 512).
inline constexpr double kTensorCollectiveWait = 2e-3;
// Fraction of the usable memory kept free: allocator fragmentation, page cache, the OS.
inline constexpr double kHeadroom = 0.10;

// Parameter count of the model as transformers' num_parameters() reports it (tied weights
// counted once), from config.json alone. Throws tessera::Error (InvalidInput) when it is beyond
// kMaxParameterCount.
std::int64_t count_parameters(const hf::ModelConfig& config);
// The same in floating point, never overflowing: what an absurd config.json asks for
// (plan/model_size.h refuses it by this figure before anything is built).
double parameter_count(const hf::ModelConfig& config);
// The most parameters the 64-bit sizes of LibTorch and of this planner count (below 2^63).
inline constexpr double kMaxParameterCount = 9.0e18;
std::vector<std::string> default_lora_targets(const hf::ModelConfig& config);

// Σ r·(in+out) over every targeted linear of every layer; unknown target names are an error.
std::int64_t count_lora_parameters(const hf::ModelConfig& config, std::int64_t rank,
                                   const std::vector<std::string>& targets);

// ddp's and zero's default bucket_size: float32 gradient bytes per collective (zero stage 2 keeps
// two buckets in flight).
inline constexpr std::uint64_t kDefaultBucketBytes = 25ull << 20;

struct MemoryEstimate {
  std::uint64_t weights = 0;    // parameters in their dtype (+ fp32 masters with bf16)
  std::uint64_t gradients = 0;  // trainable, during a step (gradient_buckets included)
  // ddp / zero: the float32 buffers gradients are reduced in (ddp and zero 1: every trainable
  // parameter's, 4 bytes each; zero 2: the two buckets in flight), part of `gradients`.
  std::uint64_t gradient_buckets = 0;
  // gemini on several ranks: the whole parameter chunks gathered at once at most (part of
  // `weights`; its `gradient_buckets` are the whole float32 gradient chunks in flight).
  std::uint64_t gathered_chunks = 0;
  std::uint64_t optimizer = 0;    // AdamW m and v, fp32
  std::uint64_t activations = 0;  // saved for backward at the peak (the loss head's backward)
  std::uint64_t runtime = 0;      // LibTorch process baseline
  std::uint64_t load_peak = 0;    // while loading: weights + the memory-mapped checkpoint
  std::uint64_t export_peak = 0;  // at the end: the exported fp32 model and its reload check
  // While a checkpoint is written, where a strategy gathers it whole on every rank (hybrid: its
  // training state at rest plus every trainable tensor's float32 weights and moments).
  std::uint64_t save_peak = 0;
  // gemini: optimizer chunks read from / written to disk during the update (at most three at
  // once: the one being updated, the next being read, the previous being written), with their
  // gradient chunks; and the cache of parameter chunks fetched from disk (at most four resident).
  std::uint64_t offload_buffers = 0;
  // Part of offload_buffers: a rank whose update runs behind the next forward reads the
  // optimizer shard of the first chunk it takes during backward (the plugin's start_read_ahead).
  std::uint64_t optimizer_read_ahead = 0;
  // gemini: the gradient file of that chunk, written but not read back by the update (the disk
  // traffic per step is that much less).
  std::uint64_t gradient_read_ahead = 0;
  // gemini: what the disk tier holds (optimizer chunks: moments, and fp32 masters in bf16;
  // parameter chunks in the compute dtype; gradient chunks in the compute dtype).
  std::uint64_t disk_optimizer = 0;
  std::uint64_t disk_weights = 0;  // fp32 masters of on-disk optimizer chunks + disk_parameters
  std::uint64_t disk_gradients = 0;
  std::uint64_t disk_parameters = 0;  // the parameter chunks on disk (part of disk_weights)
  std::uint64_t disk_trainable_parameters = 0;  // of those, trainable ones (written back)
  // gemini without a device tier: the bytes of parameter shards on disk one step's gathers read
  // (the plugin's chunk cache replayed: a chunk still gathered is not read again); 0 where the
  // step was not replayed whole (the planner then counts two reads a micro-batch).
  std::uint64_t disk_gather_reads = 0;
  // Part of `gradients` made only at the update, once backward has freed the activations:
  // `single` in bf16 widens every gradient to its float32 master's at the step.
  std::uint64_t update_gradients = 0;
  // Part of `gradients` that backward makes as it frees the activations, none of it there when
  // backward starts and the activations peak: gemini's reduced gradient shards (chunk by chunk,
  // as backward finishes each) and the reductions in flight behind the chunk being filled. The
  // peak counts the larger of the two, not their sum.
  std::uint64_t backward_gradients = 0;
  // The least a process holds in this tier whatever it trains (the host's runtime floor; a
  // GPU's is its runtime, the simulated device's nothing).
  std::uint64_t floor = kRuntimeFloorBytes;
  std::uint64_t training_peak() const {
    return weights + (gradients - update_gradients - backward_gradients) + optimizer + runtime +
           offload_buffers + std::max(activations, update_gradients + backward_gradients);
  }
  std::uint64_t disk() const { return disk_optimizer + disk_weights + disk_gradients; }
  std::uint64_t peak() const {
    return std::max({training_peak(), load_peak, export_peak, save_peak, floor});
  }
};

// `checkpoint_bytes`: size of the safetensors files (memory-mapped while loading). Per process:
// with `world_size` ranks of ddp or zero, what one rank holds.
MemoryEstimate estimate_memory(const hf::ModelConfig& config, const Settings& settings,
                               std::uint64_t checkpoint_bytes, int world_size = 1);

// gemini on a GPU (settings.device_tier): estimate_memory() is the GPU's share; this is the host
// memory's (pinned parameter chunks, optimizer chunks with their float32 masters and the
// gradients copied down to them, the disk chunks' buffers, the runtime, loading and export).
// zero with its optimizer offloaded on a GPU (settings.zero_offload): one rank's of `world_size`
// shard of float32 masters, moments and the gradient copied down, and the runtime. For other
// settings, an estimate of nothing.
MemoryEstimate estimate_host_memory(const hf::ModelConfig& config, const Settings& settings,
                                    std::uint64_t checkpoint_bytes, int world_size = 1);

// What one rank sends and receives per optimizer step over `world_size` ranks, and the time
// that takes over `link` (nothing when it was not measured: seconds stays 0). G = 4 x trainable
// bytes (gradients are reduced in float32), in ceil(G / bucket_bytes) buckets:
//   ddp, zero 1: an all_reduce of every bucket once a step: a ring moves 2(W-1)/W x G through
//                each rank;
//   zero 2:      a reduce-scatter of every bucket in every micro-batch: (W-1)/W x G each;
//   zero:        then an all_gather of the updated trainable parameters in the compute dtype,
//                bucket by bucket: (W-1)/W x their bytes.
// seconds = bytes / the link's bus bandwidth + calls x its latency (a 2-rank all_reduce of B
// bytes moves B through each rank, so the measured algorithm bandwidth is the bus bandwidth).
struct Communication {
  std::uint64_t gradient_bytes = 0;    // the reduction's share of `bytes`
  std::uint64_t all_gather_bytes = 0;  // zero: the parameters' share of `bytes`
  // hybrid: the tensor group's and the pipeline's shares of `bytes` (gradient_bytes: the data
  // group's all-reduce).
  std::uint64_t tensor_bytes = 0;
  std::uint64_t pipeline_bytes = 0;
  std::uint64_t bytes = 0;
  std::int64_t calls = 0;
  // hybrid: calls of `calls` that block every rank of a tensor group until the last arrives
  // (each also costs kTensorCollectiveWait).
  std::int64_t blocking_calls = 0;
  double seconds = 0.0;
};
Communication estimate_communication(const hf::ModelConfig& config, const Settings& settings,
                                     int world_size, const std::optional<LinkInfo>& link,
                                     std::uint64_t bucket_bytes = kDefaultBucketBytes);

struct PlanTier {
  std::string tier;  // host | device | disk
  std::string device;
  std::uint64_t budget = 0;  // usable memory
  bool simulated = false;
  MemoryEstimate estimate;
};

struct Plan {
  bool fits = false;
  std::string strategy;  // a name from job/strategies.h: the spec's, or what `auto` picks
  Settings settings;
  // Processes of the job, and of those on this machine (they share its memory and cores): the
  // memory tiers are one rank's, with 1/processes_per_node of the host's usable memory.
  int processes = 1;
  int processes_per_node = 1;
  std::uint64_t host_usable = 0;  // the whole machine's usable memory (tiers: a rank's share)
  // Several processes: what a rank sends and receives per step, and the seconds that takes at
  // the measured link (included in seconds_per_step); link_source says where the link's speed
  // comes from.
  Communication communication;
  double compute_seconds_per_step = 0.0;
  std::string link_source;
  // Several processes: every layout of the strategies that distribute (a named strategy's and
  // the others, for comparison), the chosen first, then those that fit in the order `auto` ranks
  // them, then the others by their peak; each with the settings it would fit with (micro-batch,
  // checkpointing; where nothing fits, micro-batch 1 with checkpointing, the least it needs), its
  // peak per rank by category, its step time and what of it is communication and the
  // pipeline's bubble; `summary` says in words why it lost (the chosen's: what a rank holds).
  struct Candidate {
    Settings settings;
    bool chosen = false;
    bool fits = false;
    std::uint64_t peak = 0;
    std::uint64_t weights = 0, gradients = 0, optimizer = 0, activations = 0;
    double seconds_per_step = 0.0;
    double communication_seconds = 0.0;
    double bubble = 0.0;  // hybrid with pipeline stages: the share of the step a stage idles
    std::string family;   // "ddp", "zero", "gemini", "tensor parallel", ...
    // When `peak` is reached: "training", "loading", "exporting" or "writing a checkpoint".
    std::string peak_when;
    std::string summary;
  };
  std::vector<Candidate> candidates;
  // strategy hybrid: each pipeline stage's rank (what it holds and sends), the bubble.
  std::optional<HybridLayout> hybrid;
  std::int64_t total_parameters = 0;
  std::optional<std::int64_t> checkpoint_parameters;  // counted from the safetensors headers
  std::int64_t trainable_parameters = 0;
  std::vector<PlanTier> tiers;
  double flops_per_step = 0.0;
  // The plan's step time: measured on this machine (calibration) when a run of the same or a
  // similar job recorded one, else the cost model's; time_source says which, in words.
  double seconds_per_step = 0.0;
  double modelled_seconds_per_step = 0.0;  // the cost model's (FLOPs, per-op overhead, disk)
  double warmup_seconds = 0.0;             // measured: what the first step takes beyond the others
  std::string time_source;
  std::optional<StepTimeRecord> calibration;
  // gemini: bytes read and written on disk per step (their sum, and each), and the seconds that
  // takes at the measured disk speed (0 when the disk was not measured); included in
  // seconds_per_step.
  std::uint64_t disk_bytes_per_step = 0;
  std::uint64_t disk_read_bytes_per_step = 0;
  std::uint64_t disk_write_bytes_per_step = 0;
  // Of the gradient files written, the one the update takes from memory (not read back).
  std::uint64_t disk_gradient_read_ahead_bytes = 0;
  double disk_seconds_per_step = 0.0;
  // gemini's device tier: the seconds the CPU Adam takes per step over the optimizer state in
  // host memory and on disk (a rank's share, at the CPU Adam's measured rate shared by this
  // machine's ranks; 0 when there is none or the rate was not measured); included in
  // seconds_per_step.
  double host_update_seconds_per_step = 0.0;
  // gemini's device tier: the seconds a rank's copies between host memory and the GPU take per
  // step at the GPU's measured copy rates, and the part of them that the compute and the CPU Adam
  // do not hide (included in seconds_per_step); 0 without copies or measured rates.
  double copy_seconds_per_step = 0.0;
  double exposed_copy_seconds_per_step = 0.0;
  // What else would fit, for the user to weigh (e.g. LoRA next to an offloaded full run).
  struct Alternative {
    Settings settings;
    std::uint64_t peak = 0;
    double seconds_per_step = 0.0;
    std::string summary;
  };
  std::vector<Alternative> alternatives;
  std::optional<std::int64_t> total_steps;
  // A validation set: the evaluations the run makes (every training.eval_every steps before the
  // last, and after the last) and the seconds each takes: its batches at the seconds a measured
  // run's evaluation batches took (scaled as its step was), else at the forward's share of a
  // micro-batch's step in the cost model (as the run's ETA counts them before it has timed one).
  std::int64_t evaluations = 0;
  std::int64_t evaluation_batches = 0;
  double seconds_per_evaluation = 0.0;
  std::optional<double> total_seconds() const {
    if (!total_steps) return std::nullopt;
    return seconds_per_step * static_cast<double>(*total_steps) + warmup_seconds +
           seconds_per_evaluation * static_cast<double>(evaluations);
  }
  std::string steps_source;
  std::vector<std::string> reasons;
  std::string explanation;     // one sentence
  std::string what_would_fit;  // when nothing fits: the closest configuration and its peak
};

struct PlanInputs {
  job::JobSpec spec;
  hf::ModelConfig model;
  std::uint64_t checkpoint_bytes = 0;
  std::optional<std::int64_t> checkpoint_parameters;
  std::optional<std::int64_t> dataset_rows;     // for the total when the spec gives epochs
  std::optional<std::int64_t> validation_rows;  // lines of dataset.validation_files
  HardwareProfile profile;
  // The data's tokens per sequence when a sample could be tokenized (else max_length is
  // assumed), how it was measured, and for packed text how many rows fill a block.
  std::optional<double> tokens_per_sequence;
  std::string tokens_per_sequence_source;
  std::optional<double> packed_rows_per_block;
  // Every training row was tokenized for the sample (a dataset of at most its 512 rows, not
  // packed): the longest, cut at max_length. No batch is longer, so memory is planned for it.
  std::optional<std::int64_t> longest_sequence;
  // Processes the job runs as (launch --nproc N, or the spec's nodes) and how many of them run
  // on this machine (0: all of them).
  int processes = 1;
  int processes_per_node = 0;
  // Step times measured on this machine (plan/step_times.h), and why some could not be read.
  std::vector<StepTimeRecord> step_times;
  std::vector<std::string> step_time_warnings;
};

Plan make_plan(const PlanInputs& inputs);

// The spec as it trains on `model`: a checkpoint that stores its base quantized (config.json's
// quantization_config, bitsandbytes) is QLoRA's base as stored, so method.quantize (and
// double_quant) become its format. Throws tessera::Error (InvalidInput) when method.type is not
// lora (a quantized base does not train whole) or method.quantize names another format.
job::JobSpec with_stored_quantization(const job::JobSpec& spec, const hf::ModelConfig& model);
nlohmann::json to_json(const Plan& plan);

// Reads the spec's model folder (config.json, safetensors headers) and its training files'
// row counts (lines) into PlanInputs; `spec_source` names the spec file in errors.
PlanInputs load_plan_inputs(const job::JobSpec& spec, const std::string& spec_source,
                            HardwareProfile profile);
// method.quantize on a family whose linear weights are stored [in, out] (GPT-2's Conv1D): the
// engine does not quantize those yet. Throws tessera::Error (Unsupported), for the plan and for
// the run before the data is read.
void check_quantizable(const job::JobSpec& spec, const hf::ModelConfig& model);
// Packed text makes every block dataset.max_length tokens long: on a model whose learned
// position embeddings end before that (GPT-2's n_positions), the first step would stop. Throws
// tessera::Error (InvalidInput) naming dataset.max_length, for the plan and for the run before
// anything is loaded. `packs`: the dataset is text with dataset.packing on.
void check_packed_blocks_fit(const job::JobSpec& spec, const hf::ModelConfig& model, bool packs);
// The same from a model folder already open (the runner's, read once for the whole run).
// `count_rows` false leaves dataset_rows unset (reading every line of a large dataset is not
// free: a run's advisory plan skips it).
PlanInputs plan_inputs(const job::JobSpec& spec, const hf::ModelFolder& model,
                       HardwareProfile profile, bool count_rows = true);

// For a spec naming gemini with strategy.options.host_budget: its host estimate as written
// against the budget (less kHeadroom). Returns nothing when it fits, else the refusal: the
// numbers by category and, as the hint, the nearest setting that would fit.
struct BudgetRefusal {
  std::string message;
  std::string hint;
};
std::optional<BudgetRefusal> check_host_budget(const PlanInputs& inputs);

// What strategy hybrid's options need of the job's `world_size` processes and of the model
// (`config`, null where it is not here yet): sizes whose product divides the processes, pipeline
// stages for pp_chunks and a gradient_accumulation they divide, tp_size above 1 for
// sequence_parallel, a model that splits into tp_size parts and pp_size × pp_chunks stages.
// Throws InvalidInput naming the option; the run and the plan both call it.
void check_hybrid(const job::JobSpec& spec, int world_size, const hf::ModelConfig* config);

// A step of a job (`inputs.spec`, as it ran; over `inputs.processes` ranks, one rank's device) on
// a GPU or the simulated device ran out of device memory, needing at least `needed` bytes there
// (0: not known, so at least the device's budget). The plan estimated less, so the job is planned
// again for a device smaller by that factor, where what fits also fits the real one: the changes
// that plan makes (or why none fits), as a hint for the error. Empty where the job does not compute
// on a device.
std::string change_after_device_shortfall(PlanInputs inputs, std::uint64_t needed);

}  // namespace tessera::plan

namespace tessera::plan {

// The spec a run with strategy "auto" trains with: the planned method, precision, micro-batch
// (as training.batch_size) with its gradient accumulation, and activation checkpointing.
job::JobSpec apply_settings(const job::JobSpec& spec, const Settings& settings);
// The spec's own choices as planner settings (what a run of a spec the plan applied trains
// with): method, precision, batch as one micro-batch, checkpointing, gemini's
// shares on disk.
Settings settings_as_written(const job::JobSpec& spec);
// What a run of `spec` (as planned: apply_settings) records its measured step time under: this
// machine's device for the spec's strategy, the model's shapes, the settings as written.
// `processes`: the job's (a run of several records its step under their number).
StepTimeKey step_time_key(const job::JobSpec& spec, const hf::ModelConfig& model,
                          const HardwareProfile& profile, int processes = 1,
                          int processes_per_node = 0);
// `settings` of a plan's JSON (to_json), as recorded in a run folder's plan.json.
Settings settings_from_json(const nlohmann::json& settings, const std::string& source);
// What applying `settings` changes in `spec`, one phrase each (empty: the spec as written).
std::vector<std::string> applied_changes(const job::JobSpec& spec, const Settings& settings);

}  // namespace tessera::plan
