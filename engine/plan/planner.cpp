#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "core/files.h"
#include "core/units.h"
#include "hf/families.h"
#include "job/strategies.h"
#include "memory/chunk_cache_policy.h"
#include "model/head_loss.h"
#include "parallel/pipeline_schedule.h"
#include "plan/activations.h"
#include "plan/cost_terms.h"
#include "plan/explanation.h"
#include "plan/gemini_cost.h"
#include "plan/hybrid_cost.h"
#include "plan/model_size.h"
#include "plan/plan_text.h"
#include "plan/replica_cost.h"
#include "plan/spec_settings.h"
#include "plan/step_cost.h"
#include "plan/strategy_costs.h"
#include "quant/tiles.h"

namespace tessera::plan {

using cost::counts_of;
using cost::d;
using cost::linear_shape;
using cost::to_bytes;

namespace {

// A GPU's matrix-product rate in `precision`, as the profile measured it (bf16 and fp16 on the
// bf16 rate: the same tensor cores); 50 TFLOP/s assumed where it was not measured.
double gpu_flops(const GpuInfo& gpu, const std::string& precision) {
  if (!gpu.rates.measured) return 50e12;
  const bool half = precision == "bf16" || precision == "fp16";
  return half && gpu.rates.bf16_flops > 0.0 ? gpu.rates.bf16_flops : gpu.rates.fp32_flops;
}

namespace fs = std::filesystem;
using nlohmann::json;

// One rank's compute per step by the cost model at `rank_flops`: its replica's products (every
// parameter's; zero and gemini compute whole layers too), or the strategy's own model (hybrid's
// pipeline schedule).
double rank_compute_seconds(const hf::ModelConfig& c, const Settings& s, int world_size,
                            double tokens, double rank_flops) {
  if (const StrategyCost* cost = strategy_cost(s.strategy); cost && cost->compute)
    return cost->compute(c, s, world_size, tokens, rank_flops);
  return modelled_step_seconds(s, model_work(c, s, tokens), tokens, d(c.num_hidden_layers),
                               rank_flops);
}

// A plan's settings train micro_batch × gradient_accumulation × sequence_length tokens a step.
double tokens_of(const Settings& s) {
  return d(s.micro_batch) * d(s.rows_per_example) * d(s.gradient_accumulation) *
         d(s.sequence_length);
}

// The run a record came from, as the user named its folder.
std::string run_name(const std::string& folder) {
  const fs::path p = fs::path(folder).lexically_normal();
  const std::string name = (p.has_filename() ? p : p.parent_path()).filename().string();
  return name.empty() ? folder : name;
}

}  // namespace

namespace {

// A measured step time of this machine for the plan's job, when one was recorded: the same
// settings as measured; similar ones (the same model, method, precision and strategy) scaled
// by the cost model's ratio, from the record whose tokens per step are nearest.
// `processes` above 1: only a record of the same job with as many processes counts (its step is
// the ranks' compute and communication together, which the single-process cost model does not
// scale).
void calibrate(Plan& plan, const PlanInputs& in, const std::string& device, double layers,
               double flops, int processes = 1) {
  if (processes == 1)
    for (const std::string& w : in.step_time_warnings) plan.reasons.push_back("warning: " + w);
  const StepTimeKey key{device, model_fingerprint(in.model), plan.settings, processes};
  const StepTimeRecord* best = nullptr;
  double best_distance = 0.0;
  for (const StepTimeRecord& r : in.step_times) {
    if (!similar(r.key, key) || (processes > 1 && !same(r.key, key))) continue;
    const double distance =
        same(r.key, key) ? -1.0
                         : std::abs(std::log(tokens_of(r.key.settings) / tokens_of(key.settings)));
    if (best == nullptr || distance < best_distance) {
      best = &r;
      best_distance = distance;
    }
  }
  if (best == nullptr) return;
  const std::string measured = seconds_text(best->seconds_per_step) + " per step over run " +
                               run_name(best->run) + "'s first " +
                               std::to_string(best->steps_measured) + " steps after the first";
  if (same(best->key, key)) {
    plan.seconds_per_step = best->seconds_per_step;
    plan.time_source = "calibrated from run " + run_name(best->run) + "'s first " +
                       std::to_string(best->steps_measured + 1) + " steps on this machine (" +
                       seconds_text(best->seconds_per_step) + " per step, recorded " +
                       best->recorded_at + ")";
  } else {
    const Settings& was = best->key.settings;
    // The record's job read the same data (a similar job): its sequences as long as sampled.
    const double sequence = in.tokens_per_sequence
                                ? std::min(*in.tokens_per_sequence, d(was.sequence_length))
                                : d(was.sequence_length);
    const double tokens =
        d(was.micro_batch) * d(was.rows_per_example) * d(was.gradient_accumulation) * sequence;
    const double then =
        modelled_step_seconds(was, model_work(in.model, was, tokens), tokens, layers, flops);
    if (!(then > 0.0)) return;
    plan.seconds_per_step = best->seconds_per_step * plan.modelled_seconds_per_step / then;
    plan.time_source = "scaled from a similar run: " + measured + " (micro-batch " +
                       std::to_string(was.micro_batch) + " × " +
                       std::to_string(was.gradient_accumulation) + ", sequence " +
                       std::to_string(was.sequence_length) +
                       "), times the cost model's ratio for this job's tokens per step";
  }
  plan.calibration = *best;
  // LibTorch's first step (allocations, thread pools) takes longer than the rest, once a run.
  plan.warmup_seconds = std::max(0.0, best->first_step_seconds - best->seconds_per_step) *
                        plan.seconds_per_step / best->seconds_per_step;
}

std::string link_phrase(const LinkInfo& link) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.0f MB/s and %.2f ms a call", link.bandwidth_bytes_per_s / 1e6,
                link.latency_s * 1e3);
  return std::string(buf) + " (" + link.method + ", " +
         (link.from_cache ? "cached from " : "measured ") + link.measured_at + ")";
}

// One rank's step of several: the compute of one process with the same settings (calibrated by
// a measured single-process step on this machine when there is one, else the cost model's),
// scaled by the cost model's ratio for a rank's share of the cores, plus the communication at
// the measured link.
void plan_rank_time(Plan& plan, const PlanInputs& in, const std::string& device, double layers,
                    double flops, double rank_flops, double tokens, double rank_tokens,
                    const Communication& comm) {
  const double one_process = modelled_step_seconds(
      plan.settings, model_work(in.model, plan.settings, tokens), tokens, layers, flops);
  const double rank =
      rank_compute_seconds(in.model, plan.settings, plan.processes, rank_tokens, rank_flops);
  const double share = one_process > 0.0 ? rank / one_process : 1.0;
  plan.communication = comm;
  plan.compute_seconds_per_step = rank;
  Plan probe;
  probe.total_parameters = plan.total_parameters;
  probe.settings = plan.settings;
  probe.settings.strategy = "single";
  probe.settings.zero_stage = 0;
  probe.settings.tp_size = probe.settings.pp_size = probe.settings.pp_chunks = 1;
  probe.modelled_seconds_per_step = one_process;
  probe.seconds_per_step = one_process;
  calibrate(probe, in, device, layers, flops);
  for (const std::string& r : probe.reasons) plan.reasons.push_back(r);
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2f", share);
  const std::string cores = "; × " + std::string(ratio) + " for " +
                            std::to_string(plan.processes_per_node) +
                            " ranks sharing this machine's cores (the cost model's ratio)";
  if (probe.calibration) {
    plan.compute_seconds_per_step = probe.seconds_per_step * share;
    plan.calibration = probe.calibration;
    plan.warmup_seconds = probe.warmup_seconds * share;
    plan.time_source = "compute " + probe.time_source + cores;
  } else {
    plan.time_source += cores;
  }
  plan.modelled_seconds_per_step = rank + comm.seconds;
  plan.seconds_per_step = plan.compute_seconds_per_step + comm.seconds;
  // A run of this very job with as many processes, measured on this machine: its step (the
  // slowest rank's, compute, communication and disk together) is the plan's.
  Plan measured;
  measured.total_parameters = plan.total_parameters;
  measured.settings = plan.settings;
  measured.modelled_seconds_per_step = plan.modelled_seconds_per_step;
  measured.seconds_per_step = plan.seconds_per_step;
  calibrate(measured, in, device, layers, flops, plan.processes);
  if (measured.calibration) {
    plan.seconds_per_step = measured.seconds_per_step;
    plan.compute_seconds_per_step = std::max(0.0, measured.seconds_per_step - comm.seconds);
    plan.calibration = measured.calibration;
    plan.warmup_seconds = measured.warmup_seconds;
    plan.time_source = measured.time_source + " with " + std::to_string(plan.processes) +
                       " processes (compute and communication together)";
  }
  const std::string reduction = scatters_gradients(plan.settings) ? "reduce_scatter" : "all_reduce";
  const std::string volume =
      gib(comm.bytes) + " through each rank in " + std::to_string(comm.calls) + " calls (" +
      (plan.settings.strategy == "hybrid"
           ? "the busiest rank's: its tensor group's all-reduces of activations, four per layer "
             "and micro-batch as Megatron's layers need, " +
                 gib(comm.tensor_bytes) +
                 "; its pipeline sends of activations and of their "
                 "gradients, " +
                 gib(comm.pipeline_bytes) + "; its replicas' " +
                 (plan.settings.zero_stage == 2 ? "reduce_scatter of every micro-batch's"
                                                : "all_reduce of the") +
                 " gradients, " + gib(comm.gradient_bytes) +
                 (comm.all_gather_bytes > 0
                      ? " and all_gather of the updated shares, " + gib(comm.all_gather_bytes)
                      : "")
       : comm.all_gather_bytes > 0
           ? "the gradients' " + reduction + " " + gib(comm.gradient_bytes) +
                 " and the parameters' all_gather " + gib(comm.all_gather_bytes) +
                 (plan.settings.strategy == "gemini"
                      ? " as the blocks gather their chunks in forward and backward"
                      : "")
           : "the gradients' all_reduce, 2(N-1)/N of their float32 bytes") +
      ")";
  const std::optional<LinkInfo>& link = in.profile.link;
  if (link && link->measured && link->bandwidth_bytes_per_s > 0.0) {
    plan.link_source = link_phrase(*link);
    if (plan.processes_per_node < plan.processes)
      plan.link_source +=
          "; measured between two ranks of this machine, not between machines: "
          "tessera-cli nodes check measures the LAN link";
    if (!measured.calibration)
      plan.time_source += ", plus " + seconds_text(comm.seconds) + " of communication";
    plan.reasons.push_back("communication per step: " + volume + ", " + seconds_text(comm.seconds) +
                           " at the link's " + plan.link_source +
                           "; added to the compute, which it does not overlap on the CPU");
    // The link is Gloo's; between GPUs NCCL carries the collectives, which nothing here measures.
    if (plan.settings.on_gpu)
      plan.reasons.push_back(
          "on the GPUs NCCL carries the collectives (hybrid's pipeline messages go through host "
          "memory over Gloo): the time above is Gloo's link, not NCCL's, which is not measured "
          "yet and between GPUs of one machine (NVLink, PCIe peer copies) is usually faster, so "
          "the communication time is an upper bound there");
  } else {
    plan.link_source = "not measured";
    plan.reasons.push_back("communication per step: " + volume +
                           "; the link between ranks was not measured (tessera-cli profile "
                           "measures it), so the time leaves it out");
  }
}

}  // namespace

job::JobSpec with_stored_quantization(const job::JobSpec& spec, const hf::ModelConfig& model) {
  const hf::StoredQuantization& stored = model.quantization;
  if (!stored.stored()) return spec;
  const std::string what = "the model's checkpoint stores its linear weights " + stored.describe();
  if (spec.method.type != "lora")
    throw_invalid(what + ": they train only as the frozen base of LoRA, and method.type is \"" +
                      spec.method.type + "\"",
                  "set method.type to \"lora\" (QLoRA), or start from the model's unquantized "
                  "checkpoint for full fine-tuning");
  if (spec.method.quantize != "none" && spec.method.quantize != stored.format)
    throw_invalid("method.quantize \"" + spec.method.quantize + "\": " + what +
                      ", which it will not quantize again",
                  "remove method.quantize, or set it to \"" + stored.format + "\"");
  job::JobSpec out = spec;
  out.method.quantize = stored.format;
  out.method.double_quant = stored.double_quant;
  return out;
}

namespace {

// gemini's device tier: the bytes a rank copies between host memory and the GPU per step, and
// their seconds at the profile's measured pinned-copy rates. Parameter shards off the GPU (in
// host memory or on disk) go up for every forward and backward gather; the gradient shards of
// chunks updated by the CPU Adam come down after each micro-batch's backward (float32, the
// masters' gradients); and their new values go up after the update where the values live on
// the GPU (the optimizer's off-GPU share beyond the parameters', so at least that).
// ZeRO-Offload: the gradient shares come down after the backward and the new values go up after
// the CPU Adam, each a copy per tensor queued at once, overlapping nothing (`serial`).
struct DeviceCopies {
  double during_compute_bytes = 0.0;  // prefetched and drained on the copy stream
  double after_update_bytes = 0.0;    // the new values, behind the CPU Adam chunk by chunk
  double serial_bytes = 0.0;          // beside nothing
  double during_compute_seconds = 0.0;
  double after_update_seconds = 0.0;
  double serial_seconds = 0.0;
};

// The GPU's measured pinned-copy rates, or nullopt (with a reason saying so and what `what`
// copies) where they were not measured.
const GpuRates* measured_copy_rates(Plan& plan, const HardwareProfile& hw,
                                    const std::string& what) {
  const GpuRates& rates = hw.gpus[0].rates;
  if (rates.measured && rates.host_to_device_bytes_per_s > 0.0 &&
      rates.device_to_host_bytes_per_s > 0.0) {
    plan.reasons.push_back(what);
    return &rates;
  }
  plan.reasons.push_back(what +
                         "; the GPU's copy rates were not measured, so the time leaves them out");
  return nullptr;
}

std::optional<DeviceCopies> zero_offload_copies(Plan& plan, const Settings& s,
                                                const HardwareProfile& hw, int processes) {
  const double share =
      static_cast<double>(plan.trainable_parameters) / static_cast<double>(std::max(1, processes));
  const double down = share * 4.0;
  const double up = share * (s.precision == "fp32" ? 4.0 : 2.0);
  const GpuRates* rates =
      measured_copy_rates(plan, hw,
                          std::string("ZeRO-Offload's copies between host memory and the GPU") +
                              (processes > 1 ? " on each rank" : "") + ": " + gib(to_bytes(down)) +
                              " of gradient shares down for the CPU Adam after the backward and " +
                              gib(to_bytes(up)) + " of new values up after it, per step");
  if (rates == nullptr) return std::nullopt;
  DeviceCopies c;
  c.serial_bytes = down + up;
  c.serial_seconds =
      down / rates->device_to_host_bytes_per_s + up / rates->host_to_device_bytes_per_s;
  return c;
}

std::optional<DeviceCopies> device_tier_copies(Plan& plan, const Settings& s,
                                               const HardwareProfile& hw, int processes) {
  if (hw.gpus.empty() || s.simulated_device) return std::nullopt;
  if (s.zero_offload && s.strategy == "zero") return zero_offload_copies(plan, s, hw, processes);
  if (!s.device_tier) return std::nullopt;
  const double params_off = std::min(1.0, s.host_param_frac + s.offload_param_frac);
  const double optim_off = std::min(1.0, s.host_optim_frac + s.offload_optim_frac);
  if (params_off <= 0.0 && optim_off <= 0.0) return std::nullopt;
  const double value_bytes = half_precision(s.precision) ? 2.0 : 4.0;
  const double micro_batches =
      static_cast<double>(std::max<std::int64_t>(1, s.gradient_accumulation));
  const double ranks = static_cast<double>(std::max(1, processes));
  const double total = static_cast<double>(plan.total_parameters);
  const double trainable = static_cast<double>(plan.trainable_parameters);
  DeviceCopies c;
  const double params_up = 2.0 * micro_batches * params_off * total * value_bytes / ranks;
  const double gradients_down = micro_batches * optim_off * trainable * 4.0 / ranks;
  c.during_compute_bytes = params_up + gradients_down;
  c.after_update_bytes = std::max(0.0, optim_off - params_off) * trainable * value_bytes / ranks;
  const GpuRates* rates = measured_copy_rates(
      plan, hw,
      std::string("copies between host memory and the GPU") +
          (processes > 1 ? " on each rank" : "") + ": " + gib(to_bytes(params_up)) +
          " of parameter shards up for the forward and backward, " + gib(to_bytes(gradients_down)) +
          " of gradient shards down for the CPU Adam, " + gib(to_bytes(c.after_update_bytes)) +
          " of new values up after it, per step");
  if (rates == nullptr) return std::nullopt;
  // The two directions have a copy stream each (a GPU has a copy engine each way): the forward's
  // shards go up alone, the backward's beside the gradients going down.
  const double half_up = params_up / 2.0 / rates->host_to_device_bytes_per_s;
  c.during_compute_seconds =
      half_up + std::max(half_up, gradients_down / rates->device_to_host_bytes_per_s);
  c.after_update_seconds = c.after_update_bytes / rates->host_to_device_bytes_per_s;
  return c;
}

// The copies overlap the work they run beside (the copy stream prefetches for the compute; the
// new values go up while the CPU Adam updates later chunks): what they take beyond it is added
// to the step.
void add_exposed_copies(Plan& plan, const DeviceCopies& copies, double compute_seconds) {
  const double exposed =
      std::max(0.0, copies.during_compute_seconds - compute_seconds) +
      std::max(0.0, copies.after_update_seconds - plan.host_update_seconds_per_step) +
      copies.serial_seconds;
  plan.copy_seconds_per_step =
      copies.during_compute_seconds + copies.after_update_seconds + copies.serial_seconds;
  plan.exposed_copy_seconds_per_step = exposed;
  plan.seconds_per_step += exposed;
  plan.modelled_seconds_per_step += exposed;
  plan.reasons.push_back(
      "the copies take " + seconds_text(plan.copy_seconds_per_step) +
      " at the GPU's measured copy rates" +
      (copies.serial_seconds > 0.0
           ? std::string(", between the backward, the CPU Adam and the next forward: added to "
                         "the step")
           : ", overlapping the compute (" + seconds_text(compute_seconds) +
                 ") and the CPU Adam; " +
                 (exposed > 0.0 ? seconds_text(exposed) + " of them beyond it added to the step"
                                : std::string("none beyond it"))));
}

// The data-parallel replicas of a distributed plan: each trains batch × accumulation sequences
// a step (every rank of ddp, zero and sharded gemini, each tp × pp group of hybrid).
std::int64_t replicas_of(const Settings& s, int processes) {
  return s.strategy == "hybrid"
             ? std::max<std::int64_t>(1, processes / std::max(1, s.tp_size * s.pp_size))
             : processes;
}

// The evaluations of a run with a validation set (trainer.cpp: every eval_every steps before the
// last, and after it) and what each takes: its batches of micro_batch sequences, shared among
// the replicas, each batch's forward the share of the step the cost model gives it
// (`forward_share`, of the step's seconds: measured or modelled).
void plan_evaluations(Plan& plan, const PlanInputs& in, std::int64_t replicas,
                      double forward_share) {
  const job::JobSpec& spec = in.spec;
  const Settings& s = plan.settings;
  if (!plan.total_steps || *plan.total_steps <= 0) return;
  double rows = 0.0;
  std::string rows_source;
  if (!spec.dataset.validation_files.empty() && in.validation_rows) {
    rows = d(*in.validation_rows);
    rows_source = "lines of dataset.validation";
  } else if (spec.dataset.validation_files.empty() && spec.dataset.validation_split > 0.0 &&
             in.dataset_rows) {
    rows = std::ceil(d(*in.dataset_rows) * spec.dataset.validation_split);
    rows_source = "dataset.validation_split of the training rows";
  }
  if (rows <= 0.0) return;
  if (in.packed_rows_per_block) rows /= *in.packed_rows_per_block;
  const std::int64_t eval_every = spec.training.eval_every;
  plan.evaluations = 1 + (eval_every > 0 ? (*plan.total_steps - 1) / eval_every : std::int64_t{0});
  plan.evaluation_batches = static_cast<std::int64_t>(std::ceil(rows / d(s.micro_batch)));
  const double rounds =
      std::ceil(d(plan.evaluation_batches) / d(std::max<std::int64_t>(1, replicas)));
  // A run of this job measured its evaluation batches: theirs, scaled as its step was.
  const StepTimeRecord* measured = plan.calibration &&
                                           plan.calibration->evaluation_batch_seconds > 0.0 &&
                                           plan.calibration->seconds_per_step > 0.0
                                       ? &*plan.calibration
                                       : nullptr;
  const double per_batch =
      measured != nullptr
          ? measured->evaluation_batch_seconds * plan.seconds_per_step / measured->seconds_per_step
          : plan.seconds_per_step * forward_share;
  plan.seconds_per_evaluation = per_batch * rounds;
  plan.reasons.push_back(
      std::to_string(plan.evaluations) + " evaluation" + (plan.evaluations == 1 ? "" : "s") +
      " of " + std::to_string(plan.evaluation_batches) + " batch" +
      (plan.evaluation_batches == 1 ? "" : "es") + " (" + rows_source + "), about " +
      seconds_text(plan.seconds_per_evaluation) + " each, included in the total time: " +
      (measured != nullptr ? seconds_text(measured->evaluation_batch_seconds) + " a batch as run " +
                                 run_name(measured->run) + " measured"
                           : "forwards alone, each " + std::to_string(forward_share).substr(0, 5) +
                                 " of the step by the cost model"));
}

}  // namespace

Plan make_plan(const PlanInputs& in) {
  job::JobSpec planned_spec = with_stored_quantization(in.spec, in.model);
  // Every row tokenized and none as long as max_length: no batch reaches it (batches are padded
  // to their longest row), so the activations are planned for the longest row.
  const bool shorter_rows =
      in.longest_sequence && *in.longest_sequence < planned_spec.dataset.max_length;
  if (shorter_rows)
    planned_spec.dataset.max_length = std::max<std::int64_t>(1, *in.longest_sequence);
  const job::JobSpec& spec = planned_spec;
  const hf::ModelConfig& c = in.model;
  // gemini on the tests' simulated device: planned as a GPU of its budget named "simulated", so
  // that the tests can hold the device tier's plan against what the run's events measure.
  HardwareProfile with_simulated_device;
  const bool simulated_device =
      gemini_device_tier(spec, 0) &&
      job::strategy_option("gemini", spec.strategy.options, "device") == "simulated";
  if (simulated_device) {
    with_simulated_device = in.profile;
    GpuInfo simulated;
    simulated.name = "simulated";
    simulated.bf16 = true;
    simulated.memory = size_option(spec.strategy.options, "device_budget").value_or(0);
    with_simulated_device.gpus = {simulated};
  }
  const HardwareProfile& hw = simulated_device ? with_simulated_device : in.profile;
  Plan plan;
  plan.total_parameters = count_parameters(c);
  plan.checkpoint_parameters = in.checkpoint_parameters;
  // The strategy from the table (job/strategies.h): the one the spec names, or for `auto` the
  // one the cost model below describes.
  const bool named = spec.strategy.name != job::kAutoStrategy;
  const job::StrategyInfo* strategy =
      named ? job::find_strategy(spec.strategy.name) : &job::auto_strategy();
  if (strategy == nullptr)
    throw_unsupported(
        "strategy.name: \"" + spec.strategy.name + "\" is not a strategy this build has",
        "available plugins: " + job::strategy_names() +
            " (or auto, which lets the planner choose)");
  if (!strategy->planned)
    throw_unsupported(
        "strategy.name: the planner has no cost model for \"" + strategy->name + "\" yet",
        "run it as written, or use auto");
  job::validate_strategy(spec.strategy.name, spec.strategy.options, "");
  if (shorter_rows)
    plan.reasons.push_back("every training row was tokenized: the longest is " +
                           std::to_string(*in.longest_sequence) +
                           " tokens, so no batch reaches dataset.max_length " +
                           std::to_string(in.spec.dataset.max_length) +
                           " (batches are padded to their longest row): memory is planned for " +
                           std::to_string(*in.longest_sequence));
  plan.strategy = strategy->name;

  // Several processes: each rank is planned, with its share of this machine's memory and cores.
  // `auto` weighs the planned strategies that distribute (zero at each stage); a named one must
  // distribute.
  const int processes = std::max(1, in.processes);
  const int per_node =
      in.processes_per_node > 0 ? std::min(in.processes_per_node, processes) : processes;
  const bool distributed = processes > 1;
  plan.processes = processes;
  plan.processes_per_node = per_node;
  if (spec.strategy.name == "hybrid") {
    // As the launch refuses it (runner::check_hybrid), before any estimate.
    const int tp = job::hybrid_tensor_parallel_size(spec.strategy.options);
    const int pp = job::hybrid_pipeline_parallel_size(spec.strategy.options);
    if (processes % (tp * pp) != 0)
      throw_unsupported("strategy.options: tp_size " + std::to_string(tp) + " × pp_size " +
                            std::to_string(pp) + " = " + std::to_string(tp * pp) +
                            " does not divide the " + std::to_string(processes) + " processes",
                        "plan with --nproc " + std::to_string(tp * pp) +
                            " (or a multiple), or choose sizes whose product divides " +
                            std::to_string(processes));
    check_hybrid(spec, processes, &c);  // the rest of what the launch checks
  }
  // gemini's chunk_size against the model's largest tensor, as the plugin checks it.
  check_gemini_chunk_size(c, spec);
  plan.host_usable = hw.memory.usable();
  // The layouts the choice is made among (named: the spec's), and those the plan's table lists
  // (named: every other layout too, for the user to compare).
  std::vector<Settings> distributing;
  std::vector<Settings> weighed;
  std::string distributing_names;
  const Settings as_written = written_settings(spec);
  if (distributed) {
    for (const auto& entry : job::strategies())
      if (entry.planned && entry.distributes)
        distributing_names += (distributing_names.empty() ? "" : ", ") + entry.name;
    // A quantized base (QLoRA) and preference tuning train under the strategies that take them
    // (a named other one is refused below, by name).
    const bool quantized = spec.method.quantize != "none";
    const bool preference = spec.method.preference.has_value();
    weighed = distributed_layouts(c, processes, as_written, "", quantized, preference);
    distributing = !named ? weighed
                          : distributed_layouts(c, processes, as_written, strategy->name, quantized,
                                                preference);
    for (const Settings& own : distributing)
      if (std::none_of(weighed.begin(), weighed.end(),
                       [&](const Settings& t) { return same_layout(t, own); }))
        weighed.push_back(own);
    if (named && !strategy->distributes)
      throw_unsupported("strategy.name: \"" + strategy->name +
                            "\" runs in one process; it cannot " + "run as " +
                            std::to_string(processes) + " processes",
                        "name a strategy that distributes (" + distributing_names +
                            ") or auto, or run one process");
    if (distributing.empty())
      throw_unsupported("strategy.name: the planner has no strategy that distributes to plan " +
                            std::to_string(processes) + " processes with",
                        "run one process");
  }

  const bool gpu = plans_on_gpu(spec, hw, processes, per_node);
  // Preference tuning and QLoRA under the strategies the table says take
  // them; the trainer refuses the rest too, but the plan says so before anything loads.
  if (spec.method.preference && named &&
      !job::strategy_can(spec.strategy.name, &job::StrategyInfo::preference))
    throw_unsupported(
        "method.preference under strategy " + spec.strategy.name + " is not supported yet",
        "use strategy " + job::strategies_that_can(&job::StrategyInfo::preference) + " (or auto)");
  if (spec.method.quantize != "none") {
    check_quantizable(spec, c);
    if (named && !job::strategy_can(spec.strategy.name, &job::StrategyInfo::quantized_base))
      throw_unsupported(
          "method.quantize under strategy " + spec.strategy.name + " is not supported yet",
          "use strategy " + job::strategies_that_can(&job::StrategyInfo::quantized_base) +
              " (or auto)");
  }
  // A strategy asked for cuda on a machine whose profile has no GPU, or too few for its ranks
  // (each computes on a GPU of its own): the run refuses it, and so does the plan. Ranks over
  // several machines compute on the nodes' GPUs, which this machine's profile does not list: the
  // plan shows the host's figures and says they are.
  if (job::strategy_option(spec.strategy.name, spec.strategy.options, "device") == "cuda") {
    const int gpus = static_cast<int>(hw.gpus.size());
    if (processes <= per_node && gpus == 0)
      throw_unsupported("strategy " + spec.strategy.name +
                            ": strategy.options.device \"cuda\" but no CUDA device is present "
                            "on this machine (its profile lists no GPU)",
                        "use device \"cpu\" or \"auto\"");
    if (named && processes <= per_node && per_node > gpus && distributed && !job::tests_share_gpu())
      throw_invalid("strategy " + spec.strategy.name + ": strategy.options.device \"cuda\" with " +
                        std::to_string(per_node) + " ranks on a machine with " +
                        std::to_string(gpus) + " GPU(s); each rank computes on a GPU of its own",
                    "start at most " + std::to_string(gpus) +
                        " processes on this machine (launch --nproc), or use device \"cpu\"");
    if (named && !gpu)
      plan.reasons.push_back("warning: strategy " + spec.strategy.name +
                             " on cuda is planned as if it computed on the CPU: this machine's "
                             "profile lists no GPU for its ranks on other machines (the run's "
                             "memory events show the GPU's)");
  }
  // gemini's device-tier options where it computes on the CPU (device auto without a GPU): the
  // run refuses them, and so does the plan.
  if (spec.strategy.name == "gemini" && !gpu && !simulated_device)
    for (const char* key : {"host_param_frac", "host_optim_frac", "device_budget"})
      if (spec.strategy.options.contains(key))
        throw_invalid(std::string("strategy.options.") + key +
                          ": it places or sizes shards on a device, and this job computes on "
                          "the CPU (this machine's profile lists no GPU for it)",
                      "remove it (offload_param_frac and offload_optim_frac place shards on "
                      "disk)");
  if (!gpu && distributed && spec.strategy.name == job::kAutoStrategy && !hw.gpus.empty())
    plan.reasons.push_back(
        "strategy auto over several processes computes on the CPU: name ddp, "
        "zero or hybrid (device auto or cuda) to train on the GPUs");
  PlanTier tier;
  tier.tier = gpu ? "device" : "host";
  tier.device = simulated_device ? "simulated" : gpu ? "cuda:0 (" + hw.gpus[0].name + ")" : "cpu";
  tier.budget = gpu ? hw.gpus[0].memory : hw.memory.usable() / static_cast<std::uint64_t>(per_node);
  if (gpu && spec.strategy.name == "gemini") {
    // gemini's device_budget: the GPU memory its chunks may use, when smaller than the GPU's.
    const std::uint64_t device_budget =
        size_option(spec.strategy.options, "device_budget").value_or(0);
    if (device_budget > 0) tier.budget = std::min(tier.budget, device_budget);
  }
  if (distributed)
    tier.device = simulated_device ? "simulated, one for each of the " + std::to_string(per_node) +
                                         " ranks on this machine"
                  : gpu ? "cuda (" + hw.gpus[0].name + "), a GPU for each of the " +
                              std::to_string(per_node) + " ranks on this machine"
                        : "cpu, one of " + std::to_string(per_node) + " ranks on this machine";
  tier.simulated = gpu ? simulated_device : hw.memory.simulated.has_value();
  const std::uint64_t limit =
      static_cast<std::uint64_t>(static_cast<double>(tier.budget) * (1.0 - kHeadroom));
  const bool bf16_native = gpu ? hw.gpus[0].bf16 : hw.cpu.native_bf16();

  Settings base = written_settings(spec, static_cast<int>(hw.gpus.size()), processes, per_node);
  base.on_gpu = gpu;
  if (!gpu) {  // gemini asked for cuda on a machine without one: planned as on the CPU (said above)
    base.device_tier = false;
    base.host_optim_frac = base.host_param_frac = 0.0;
  }
  // ZeRO-Offload moves the shard's optimizer state to host memory on a GPU only (on the CPU it is
  // there already).
  const bool offload_asked =
      spec.strategy.name == "zero" &&
      job::strategy_option("zero", spec.strategy.options, "offload_optimizer") == "true";
  base.zero_offload = gpu && offload_asked;
  if (offload_asked && !gpu)  // as the run warns
    plan.reasons.push_back(
        "warning: strategy.options.offload_optimizer: this job computes on the CPU, so the "
        "optimizer state is in host memory and updated by the CPU Adam already; the option "
        "changes nothing here");
  // fp16 (with its loss scaler) computes on a GPU only: a strategy named on the CPU is refused as
  // the run refuses it; auto trains bf16 there instead (or fp32, below) and says so.
  if (base.precision == "fp16" && !gpu) {
    if (named)
      throw_unsupported("precision fp16 is not supported on the CPU yet",
                        "use bf16 (or fp32) on the CPU; fp16 with loss scaling needs CUDA");
    base.precision = "bf16";
    if (bf16_native)
      plan.reasons.push_back(
          "precision bf16 instead of fp16: fp16 (with its loss scaler) computes on a GPU only");
  }
  if (base.precision == "bf16" && !bf16_native) {
    base.precision = "fp32";
    plan.reasons.push_back(std::string("precision fp32 instead of ") + spec.precision + ": " +
                           (spec.precision == "fp16" ? "fp16 computes on a GPU only, and " : "") +
                           "the " + (gpu ? "GPU" : "CPU") + " has no native bf16" +
                           (gpu ? "" : " (no avx512_bf16 or amx_bf16)"));
  }
  const std::int64_t batch = std::max<std::int64_t>(1, spec.training.batch_size);
  std::vector<std::int64_t> micro_batches;  // divisors of the batch, largest first
  for (std::int64_t b = 1; b <= batch / b; ++b)
    if (batch % b == 0) {
      micro_batches.push_back(b);
      if (b != batch / b) micro_batches.push_back(batch / b);
    }
  std::sort(micro_batches.rbegin(), micro_batches.rend());
  // kto pairs each prompt with another example's completion of its micro-batch (the job spec
  // refuses a batch_size of 1 for it): never split below 2.
  if (spec.method.preference && spec.method.preference->loss == "kto")
    std::erase_if(micro_batches, [](std::int64_t b) { return b < 2; });

  // The disk tier gemini may fill: the free space of the run's filesystem, less the headroom.
  const std::uint64_t disk_limit =
      hw.disk ? static_cast<std::uint64_t>(static_cast<double>(hw.disk->free) * (1.0 - kHeadroom))
              : 0;
  // Several ranks on this machine each fill a disk tier of their own on the same filesystem.
  // gemini's device tier and ZeRO-Offload also keep a share in host memory: that must fit the
  // host's budget (each rank's share of it).
  const std::uint64_t host_limit = static_cast<std::uint64_t>(
      static_cast<double>(hw.memory.usable() / static_cast<std::uint64_t>(per_node)) *
      (1.0 - kHeadroom));
  auto fits = [&](const Settings& s) {
    const MemoryEstimate e = estimate_memory(c, s, in.checkpoint_bytes, processes);
    if ((s.device_tier || s.zero_offload) &&
        estimate_host_memory(c, s, in.checkpoint_bytes, processes).peak() > host_limit)
      return false;
    return e.peak() <= limit &&
           (e.disk() == 0 || saturating_mul(static_cast<std::int64_t>(e.disk()), per_node) <=
                                 static_cast<std::int64_t>(disk_limit));
  };
  // Largest micro-batch without checkpointing, then with it; for each, the first of
  // `fractions` (gemini's shares on disk: optimizer state, parameters) that fits ({0, 0} for
  // single).
  struct Fractions {
    double optim = 0.0;
    double param = 0.0;
    double host_optim = 0.0;  // gemini's device tier: shares in host memory
    double host_param = 0.0;
  };
  // The sequences a step trains over every rank: the spec's g × B on each of the N processes, or,
  // where the spec names a layout whose tp · pp ranks share each micro-batch (hybrid), on each of
  // its N / (tp · pp) replicas. Every layout weighed trains as many (`auto` runs hybrid's with tp ·
  // pp times the accumulation steps), so their step times compare.
  const std::int64_t step_sequences = saturating_mul(
      saturating_mul(spec.training.gradient_accumulation, batch),
      named ? std::max(1, processes / (as_written.tp_size * as_written.pp_size)) : processes);
  // The accumulation steps of `s` at micro-batch `mb` that train them (rounded up where its
  // replicas × mb do not divide them).
  auto accumulation_at = [&](const Settings& s, std::int64_t mb) {
    const std::int64_t per_step =
        saturating_mul(std::max(1, processes / (s.tp_size * s.pp_size)), mb);
    return std::max<std::int64_t>(
        1, step_sequences / per_step + (step_sequences % per_step != 0 ? 1 : 0));
  };
  auto search = [&](Settings s, const std::vector<Fractions>& fractions,
                    const std::string& precision) -> std::optional<Settings> {
    for (bool ckpt : {spec.training.activation_checkpointing, true})
      for (std::int64_t mb : micro_batches)
        for (const Fractions& f : fractions) {
          s.precision = precision;
          s.activation_checkpointing = ckpt;
          s.micro_batch = mb;
          s.gradient_accumulation = accumulation_at(s, mb);
          s.offload_optim_frac = f.optim;
          s.offload_param_frac = f.param;
          s.host_optim_frac = f.host_optim;
          s.host_param_frac = f.host_param;
          if (fits(s)) return s;
        }
    return std::nullopt;
  };
  // The user's precision first, bf16 (when native) only if nothing fits in it.
  std::vector<std::string> precisions = {base.precision};
  if (base.precision == "fp32" && bf16_native) precisions.push_back("bf16");

  // The step time a rank's settings would take by the cost model: the rank's compute with its
  // share of this machine's cores (launch gives each rank cores / ranks threads), plus the
  // communication at the measured link. Sequences are padded to the longest of their batch, not
  // to max_length: the time follows the sampled data's length where it was measured (the memory
  // keeps max_length, which a batch can reach).
  const double sequence = in.tokens_per_sequence
                              ? std::min(*in.tokens_per_sequence, d(base.sequence_length))
                              : d(base.sequence_length);
  // Preference tuning computes two rows an example (chosen and rejected; KTO's mismatched row).
  const double tokens =
      d(batch) * d(base.rows_per_example) * d(spec.training.gradient_accumulation) * sequence;
  const double layers = d(c.num_hidden_layers);
  const double flops = gpu ? gpu_flops(hw.gpus[0], base.precision) : hw.cpu_flops;
  // The ranks of this machine share its cores, but each has a GPU of its own.
  const double rank_flops = gpu ? flops : flops / d(per_node);
  // ddp's and zero's bucket_size: "auto" (the default, 25 MiB), a size, or a number of bytes.
  const std::uint64_t bucket_bytes =
      spec.strategy.name == "ddp" || spec.strategy.name == "zero"
          ? size_option(spec.strategy.options, "bucket_size").value_or(kDefaultBucketBytes)
          : kDefaultBucketBytes;
  auto communication_of = [&](const Settings& t) {
    return estimate_communication(c, t, processes, hw.link, bucket_bytes);
  };
  // The tokens a rank's settings push through its replica in a step: the spec's per-rank batch
  // (hybrid's replica: its micro-batches, tp · pp times as many under `auto`).
  auto rank_tokens = [&](const Settings& t) {
    return tokens * d(t.micro_batch) * d(t.gradient_accumulation) /
           (d(batch) * d(std::max<std::int64_t>(1, spec.training.gradient_accumulation)));
  };
  auto rank_seconds = [&](const Settings& t) {
    return rank_compute_seconds(c, t, processes, rank_tokens(t), rank_flops) +
           communication_of(t).seconds;
  };
  // How `auto` ranks the layouts that fit: layers split over ranks (hybrid's tensor and pipeline
  // parallelism) only where no layout keeping whole layers on a rank fits, since splitting costs
  // collectives in every layer and the pipeline's idle time for memory; then the fewest changes
  // (checkpointing as the spec says, the user's micro-batch); then the quickest step.
  // `seconds`: t's rank_seconds, which the caller has already.
  auto choice_key = [&](const Settings& t, double seconds) {
    return LayoutKey{!named && t.tp_size * t.pp_size > 1,
                     t.activation_checkpointing != spec.training.activation_checkpointing,
                     batch / t.micro_batch, seconds};
  };
  // Among the strategies that distribute, the settings that fit with the fewest changes (the
  // search's order: the user's micro-batch, then smaller ones, then checkpointing), and of
  // those the quickest step.
  // gemini keeps the spec's shares on disk (`from`'s; 0 unless the spec names gemini) unless
  // `gemini_fractions` gives the shares to try.
  auto pick_distributed =
      [&](const Settings& from, const std::string& precision,
          const std::vector<Fractions>& gemini_fractions = {}) -> std::optional<Settings> {
    std::optional<Settings> best;
    LayoutKey best_key;
    for (const Settings& option : distributing) {
      const Settings t = with_layout(from, option);
      if (!gemini_fractions.empty() && t.strategy != "gemini") continue;
      const std::vector<Fractions> fractions =
          t.strategy != "gemini" ? std::vector<Fractions>{{0.0, 0.0}}
          : gemini_fractions.empty()
              ? std::vector<Fractions>{{from.offload_optim_frac, from.offload_param_frac,
                                        from.host_optim_frac, from.host_param_frac}}
              : gemini_fractions;
      const auto found = search(t, fractions, precision);
      if (!found) continue;
      const LayoutKey key = choice_key(*found, rank_seconds(*found));
      if (!best || key < best_key) {
        best = found;
        best_key = key;
      }
    }
    return best;
  };
  const bool named_gemini = spec.strategy.name == "gemini";
  // `auto` keeps the user's method: full fine-tuning that does not fit in RAM moves optimizer
  // state to disk (gemini, CPU only), then parameter chunks too, before it changes the precision
  // or falls back to LoRA.
  // Of several processes, gemini's shards go to disk in the same order (optimizer, then
  // parameters), each rank's share on this machine's disk.
  const bool gemini_distributes =
      std::any_of(distributing.begin(), distributing.end(),
                  [](const Settings& t) { return t.strategy == "gemini"; });
  const bool may_offload = !named_gemini && spec.strategy.name == job::kAutoStrategy && !gpu &&
                           (!distributed || gemini_distributes) && base.method == "full" &&
                           disk_limit > 0;
  // On a GPU, `auto` keeps the user's method too: fine-tuning that does not fit the GPU goes
  // to gemini's device tier with the optimizer state in host memory, then parameter chunks
  // there too, then the optimizer state on disk (LoRA: its frozen base's chunks, as its optimizer
  // state is small), before QLoRA quantizes the base. gemini named with shares that do not fit
  // moves more the same way (never less than the spec's off the device, nothing back from disk)
  // before its method changes.
  const bool spill_named_gemini = named_gemini && base.device_tier;
  const bool may_spill_to_host =
      (spec.strategy.name == job::kAutoStrategy || spill_named_gemini) && gpu && !distributed;
  auto keeps_the_specs_shares = [&](const Fractions& f) {
    return !spill_named_gemini ||
           (f.optim >= base.offload_optim_frac && f.param >= base.offload_param_frac &&
            f.optim + f.host_optim >= base.offload_optim_frac + base.host_optim_frac &&
            f.param + f.host_param >= base.offload_param_frac + base.host_param_frac);
  };
  // `from` on gemini's device tier with the shares off the GPU growing in that order.
  auto spill_to_host = [&](const Settings& from,
                           const std::string& precision) -> std::optional<Settings> {
    Settings spilled = from;
    spilled.strategy = "gemini";
    spilled.device_tier = true;
    std::vector<Fractions> shares;
    for (double f : {0.25, 0.5, 0.75, 1.0}) shares.push_back({0.0, 0.0, f, 0.0});
    for (double f : {0.25, 0.5, 0.75, 1.0}) shares.push_back({0.0, 0.0, 1.0, f});
    if (disk_limit > 0) {
      for (double f : {0.25, 0.5, 0.75, 1.0}) shares.push_back({f, 0.0, 1.0 - f, 1.0});
      // Then the parameter chunks follow the optimizer state to disk.
      for (double f : {0.25, 0.5, 0.75, 1.0}) shares.push_back({1.0, f, 0.0, 1.0 - f});
    }
    std::erase_if(shares, [&](const Fractions& f) { return !keeps_the_specs_shares(f); });
    return search(spilled, shares, precision);
  };
  // `from` listed as what else would fit, in the first precision it fits in (if any).
  auto add_alternative = [&](const Settings& from) {
    for (const std::string& p : precisions)
      if (auto alternative = search(from, {{0.0, 0.0}}, p)) {
        Plan::Alternative a;
        a.settings = *alternative;
        a.peak = estimate_memory(c, *alternative, in.checkpoint_bytes).peak();
        plan.alternatives.push_back(a);
        return;
      }
  };
  std::optional<Settings> chosen;
  for (const std::string& precision : precisions) {
    chosen = distributed ? pick_distributed(base, precision)
                         : search(base,
                                  {{base.offload_optim_frac, base.offload_param_frac,
                                    base.host_optim_frac, base.host_param_frac}},
                                  precision);
    if (!chosen && may_spill_to_host) {
      chosen = spill_to_host(base, precision);
      if (!chosen) continue;
      const auto on_host = estimate_host_memory(c, *chosen, in.checkpoint_bytes);
      plan.reasons.push_back(
          std::string(base.method == "full"     ? "full fine-tuning"
                      : base.quantize != "none" ? "QLoRA"
                                                : "LoRA") +
          " does not fit in " + gib(limit) + " of the GPU with " +
          (spill_named_gemini ? "the spec's shares off it" : "everything there") +
          ": gemini's device tier keeps " + in_host_phrase(*chosen) + " in host memory (" +
          gib(on_host.peak()) + " of the host's " + gib(host_limit) + ")" +
          (chosen->offload_optim_frac > 0.0 || chosen->offload_param_frac > 0.0
               ? " and " + on_disk_phrase(*chosen) + " on disk in " + hw.disk->path
               : std::string()) +
          ", brought to the GPU as blocks need them");
      break;
    }
    if (chosen || !may_offload) {
      if (chosen) break;
      continue;
    }
    if (distributed) {
      chosen =
          pick_distributed(base, precision, {{0.25, 0.0}, {0.5, 0.0}, {0.75, 0.0}, {1.0, 0.0}});
      if (!chosen)
        chosen =
            pick_distributed(base, precision, {{1.0, 0.25}, {1.0, 0.5}, {1.0, 0.75}, {1.0, 1.0}});
      if (!chosen) continue;
      const auto e = estimate_memory(c, *chosen, in.checkpoint_bytes, processes);
      plan.reasons.push_back("full fine-tuning does not fit in " + gib(limit) +
                             " per rank with everything in RAM: gemini keeps " +
                             on_disk_phrase(*chosen) + " of each rank's shards on disk (" +
                             gib(e.disk()) + " per rank, " +
                             gib(e.disk() * static_cast<std::uint64_t>(per_node)) + " for the " +
                             std::to_string(per_node) + " ranks of this machine) in " +
                             hw.disk->path + " (" + gib(hw.disk->free) + " free)");
      break;
    }
    Settings offloaded = base;
    offloaded.strategy = "gemini";
    // The optimizer state first (it costs disk traffic in the update only), at any micro-batch;
    // the parameters (read again in every forward and backward) only when that is not enough.
    chosen = search(offloaded, {{0.25, 0.0}, {0.5, 0.0}, {0.75, 0.0}, {1.0, 0.0}}, precision);
    if (!chosen)
      chosen = search(offloaded, {{1.0, 0.25}, {1.0, 0.5}, {1.0, 0.75}, {1.0, 1.0}}, precision);
    if (!chosen) continue;
    const auto e = estimate_memory(c, *chosen, in.checkpoint_bytes);
    plan.reasons.push_back(
        "full fine-tuning does not fit in " + gib(limit) + " with everything in RAM" +
        (chosen->offload_param_frac > 0.0 ? " or with only the optimizer state on disk" : "") +
        ": gemini keeps " + on_disk_phrase(*chosen) + " (" + gib(e.disk()) + ") on disk in " +
        hw.disk->path + " (" + gib(hw.disk->free) + " free)");
    Settings lora = base;
    lora.method = "lora";
    add_alternative(lora);
    break;
  }
  if (!chosen && base.method == "full") {
    Settings lora = base;
    lora.method = "lora";
    if (!distributed) lora.strategy = "single";
    for (const std::string& p : precisions)
      if ((chosen = distributed ? pick_distributed(lora, p) : search(lora, {{0.0, 0.0}}, p))) break;
    // On a GPU, LoRA's frozen base spills to host memory before it is quantized.
    for (const std::string& p : precisions)
      if (!chosen && may_spill_to_host && (chosen = spill_to_host(lora, p))) break;
    if (chosen)
      plan.reasons.push_back(
          "full fine-tuning does not fit in " + gib(limit) +
          (!may_offload  ? ""
           : distributed ? " even with gemini's optimizer shards on disk,"
                         : " even with the optimizer state and the parameters on disk,") +
          " even with micro-batch 1 and activation checkpointing: LoRA (rank " +
          std::to_string(lora.lora_rank) + ")" +
          (chosen && chosen->device_tier
               ? " on gemini's device tier, " + in_host_phrase(*chosen) + " in host memory,"
               : std::string()) +
          " instead — the method changes");
  }
  // Neither does LoRA (the spec's or the fallback): QLoRA, the base's linear layers held in NF4
  // with double-quantized absmax, where the engine trains it (one process, on the CPU or the
  // GPU, a family whose linear weights are [out, in]).
  const bool may_quantize =
      !distributed && base.quantize == "none" &&
      (spec.strategy.name == job::kAutoStrategy || spec.strategy.name == "single") &&
      (c.family == hf::ModelFamily::Llama || c.family == hf::ModelFamily::Mistral ||
       c.family == hf::ModelFamily::Qwen2);
  // `from` as QLoRA under single: LoRA on the base in nf4 with double-quantized absmax.
  const auto as_qlora = [](Settings from) {
    from.method = "lora";
    from.strategy = "single";
    from.device_tier = false;
    from.host_optim_frac = from.host_param_frac = 0.0;
    from.offload_optim_frac = from.offload_param_frac = 0.0;
    from.quantize = "nf4";
    from.double_quant = true;
    return from;
  };
  // LoRA spilled off the GPU streams its frozen base over the bus every step: QLoRA, which
  // might fit the GPU whole, is shown beside it.
  if (chosen && may_quantize && chosen->device_tier && chosen->method == "lora")
    add_alternative(as_qlora(*chosen));
  if (!chosen && may_quantize) {
    const Settings qlora = as_qlora(base);
    for (const std::string& p : precisions)
      if ((chosen = search(qlora, {{0.0, 0.0}}, p))) break;
    if (chosen)
      plan.reasons.push_back(
          std::string(base.method == "full" ? "neither full fine-tuning nor LoRA" : "LoRA") +
          " fits in " + gib(limit) +
          " even with micro-batch 1 and activation checkpointing: QLoRA (rank " +
          std::to_string(qlora.lora_rank) +
          ", the base's linear layers in nf4 with double-quantized absmax) instead — the method "
          "changes");
  }
  plan.fits = chosen.has_value();
  if (!chosen) {
    // The smallest configuration the engine has, to show how far off the job is.
    Settings least = base;
    least.method = "lora";
    if (may_quantize) least = as_qlora(least);
    least.micro_batch = 1;
    least.gradient_accumulation = saturating_mul(spec.training.gradient_accumulation, batch);
    least.activation_checkpointing = true;
    if (bf16_native && least.precision == "fp32") least.precision = "bf16";
    // Of several processes, the strategy that shards the most.
    if (distributed) {
      least.strategy = distributing.back().strategy;
      least.zero_stage = distributing.back().zero_stage;
    }
    chosen = least;
    const auto e = estimate_memory(c, least, in.checkpoint_bytes, processes);
    plan.what_would_fit =
        "the smallest setting (" + std::string(may_quantize ? "QLoRA on an nf4 base" : "LoRA") +
        ", micro-batch 1, activation checkpointing, " + least.precision + ") needs " +
        gib(e.peak()) + " but " + gib(limit) + " is usable; a machine with at least " +
        gib(to_bytes(static_cast<double>(e.peak()) / (1.0 - kHeadroom))) +
        " free, or a smaller model, would fit";
  }
  plan.settings = *chosen;
  const Settings& s = plan.settings;
  if (s.strategy == "hybrid") plan.hybrid = hybrid_layout(c, s, processes, kDefaultBucketBytes);
  plan.strategy = s.strategy == "gemini" || distributed ? s.strategy : plan.strategy;
  tier.estimate = estimate_memory(c, s, in.checkpoint_bytes, processes);
  plan.tiers.push_back(tier);
  if (gpu && (s.device_tier || s.zero_offload)) {
    PlanTier host;
    host.tier = "host";
    host.device =
        distributed ? "cpu, one of " + std::to_string(per_node) + " ranks on this machine" : "cpu";
    host.budget = hw.memory.usable() / static_cast<std::uint64_t>(per_node);
    host.simulated = hw.memory.simulated.has_value();
    host.estimate = estimate_host_memory(c, s, in.checkpoint_bytes, processes);
    plan.tiers.push_back(host);
  }
  if (tier.estimate.disk() > 0) {
    PlanTier disk;
    disk.tier = "disk";
    disk.device = hw.disk ? hw.disk->path : "";
    // Each rank's disk tier, as the host tier is each rank's: its share of the free disk.
    disk.budget = hw.disk ? hw.disk->free / static_cast<std::uint64_t>(per_node) : 0;
    if (distributed)
      disk.device +=
          ", a folder for each of the " + std::to_string(per_node) + " ranks on this machine";
    disk.estimate.optimizer = tier.estimate.disk_optimizer;
    disk.estimate.weights = tier.estimate.disk_weights;
    disk.estimate.gradients = tier.estimate.disk_gradients;
    plan.tiers.push_back(disk);
  }
  plan.trainable_parameters = s.method == "lora"
                                  ? count_lora_parameters(c, s.lora_rank, s.lora_targets)
                                  : plan.total_parameters;

  if (plan.fits && distributed) {
    // Every layout weighed, each at the settings it would fit with (by the same search), or at
    // the least it needs (micro-batch 1 with checkpointing) where nothing fits.
    for (const Settings& option : weighed) {
      Plan::Candidate candidate;
      candidate.chosen = same_layout(option, s);
      Settings t = s;
      candidate.fits = true;  // the chosen's; another's by its own search
      if (!candidate.chosen) {
        t = with_layout(s, option);
        if (t.strategy != s.strategy)  // gemini's shares belong to gemini
          t.offload_optim_frac = t.offload_param_frac = t.host_optim_frac = t.host_param_frac = 0.0;
        const auto found = search(
            t, {{t.offload_optim_frac, t.offload_param_frac, t.host_optim_frac, t.host_param_frac}},
            s.precision);
        candidate.fits = found.has_value();
        if (found) {
          t = *found;
        } else {
          t.micro_batch = 1;
          t.activation_checkpointing = true;
          t.gradient_accumulation = accumulation_at(t, 1);
        }
      }
      candidate.settings = t;
      const MemoryEstimate e = estimate_memory(c, t, in.checkpoint_bytes, processes);
      candidate.peak = e.peak();
      candidate.peak_when = e.peak() == e.save_peak     ? "writing a checkpoint"
                            : e.peak() == e.load_peak   ? "loading"
                            : e.peak() == e.export_peak ? "exporting"
                                                        : "training";
      candidate.weights = e.weights;
      candidate.gradients = e.gradients;
      candidate.optimizer = e.optimizer;
      candidate.activations = e.activations;
      candidate.seconds_per_step = rank_seconds(t);
      candidate.communication_seconds = communication_of(t).seconds;
      if (t.tp_size * t.pp_size > 1)
        candidate.bubble = hybrid_layout(c, t, processes, kDefaultBucketBytes).bubble;
      candidate.family = layout_family(t);
      plan.candidates.push_back(candidate);
    }
    explain_distributed(plan, in, limit, distributing_names, choice_key);
  }
  if (plan.fits && plan.hybrid) {
    for (const HybridStage& st : plan.hybrid->stages) {
      const HybridStageMemory held = hybrid_stage_memory(st, s);
      plan.reasons.push_back(
          "stage " + std::to_string(st.stage) + " (" + st.layers +
          (st.first ? ", the embedding" : "") + (st.last ? ", the head" : "") + "): each of its " +
          std::to_string(plan.hybrid->tp * plan.hybrid->dp) + " ranks holds weights " +
          gib(to_bytes(held.weights)) + ", gradients " + gib(to_bytes(held.gradients)) +
          ", optimizer state " + gib(to_bytes(held.optimizer)) + " and activations " +
          gib(to_bytes(held.activations)) + " (" + std::to_string(st.micro_batches_held) +
          " micro-batches alive at once); per step it sends " + gib(to_bytes(st.pipeline_bytes)) +
          " to its neighbour stages in " + std::to_string(st.pipeline_sends) + " sends and moves " +
          gib(to_bytes(st.tensor_bytes)) + " through its tensor group");
    }
  }
  if (plan.fits) {
    std::size_t planned = 0;
    for (const auto& entry : job::strategies()) planned += entry.planned ? 1 : 0;
    if (!distributed)
      plan.reasons.insert(
          plan.reasons.begin(),
          "strategy " + plan.strategy + ": one process on " + tier.device +
              (planned == 1 ? ", the only strategy this build has" : "") +
              (s.strategy != "gemini" ? std::string()
               : s.device_tier ? ", parameters in chunks (its device tier), " + in_host_phrase(s) +
                                     " in host memory" +
                                     (s.offload_optim_frac > 0.0 || s.offload_param_frac > 0.0
                                          ? ", " + on_disk_phrase(s) + " on disk"
                                          : std::string())
               : s.offload_param_frac > 0.0 || s.offload_optim_frac > 0.0
                   ? ", parameters in chunks, " + on_disk_phrase(s) + " on disk"
                   : std::string(", parameters and optimizer state in chunks in memory")));
    if (s.micro_batch < batch)
      plan.reasons.push_back("micro-batch " + std::to_string(s.micro_batch) + " × " +
                             std::to_string(batch / s.micro_batch) + " accumulation steps: batch " +
                             std::to_string(batch) + " does not fit at once");
    if (s.activation_checkpointing && !spec.training.activation_checkpointing)
      plan.reasons.push_back("activation checkpointing: needed to fit");
    if (s.precision != base.precision)
      plan.reasons.push_back("bf16: fp32 does not fit and the hardware has native bf16");
  }
  if (const double table = cost::table_in_file(c, s); table > 0.0) {
    const bool head = cost::head_in_file(c, s);
    plan.reasons.push_back(
        (head ? "the frozen input embedding and output head (" : "the frozen input embedding (") +
        core::human_bytes(to_bytes(table * (half_precision(s.precision) ? 2.0 : 4.0))) +
        ") stay in the checkpoint file, read by rows as batches look them up" +
        (head ? " and by blocks of the vocabulary for the loss" : ""));
  }
  if (in.tokens_per_sequence)
    plan.reasons.push_back("time for " + std::to_string(static_cast<std::int64_t>(sequence + 0.5)) +
                           " tokens per sequence: " + in.tokens_per_sequence_source);
  plan.flops_per_step = step_flops(s, model_work(c, s, tokens), tokens);
  // The chosen precision's rate (the search weighed candidates at the user's).
  const double chosen_flops = gpu ? gpu_flops(hw.gpus[0], s.precision) : flops;
  plan.modelled_seconds_per_step =
      modelled_step_seconds(s, model_work(c, s, tokens), tokens, layers, chosen_flops);
  plan.seconds_per_step = plan.modelled_seconds_per_step;
  char rate[48];
  std::snprintf(rate, sizeof rate, "%.0f GFLOP/s", chosen_flops / 1e9);
  const std::string rate_source =
      !gpu ? "the CPU's " + std::string(rate) + " (" + hw.flops_source + ")"
      : hw.gpus[0].rates.measured
          ? "the GPU's " + std::string(rate) + " (" + s.precision + " matrix products measured " +
                (hw.gpus[0].rates.from_cache ? "at " : "now, ") + hw.gpus[0].rates.measured_at + ")"
          : "the GPU's assumed " + std::string(rate) + " (not measured)";
  plan.time_source = "estimated from " + rate_source +
                     " and a per-op overhead; no run of this job has been measured on this "
                     "machine yet";
  const double compute_seconds = plan.modelled_seconds_per_step;  // before what adds to it
  const std::uint64_t disk_bytes = tier.estimate.disk();
  if (disk_bytes > 0) {
    const MemoryEstimate& e = tier.estimate;
    const double micro_batches = d(saturating_mul(
        spec.training.gradient_accumulation, batch / std::max<std::int64_t>(1, s.micro_batch)));
    const double optimizer_chunks =
        d(static_cast<std::int64_t>(disk_bytes - e.disk_gradients - e.disk_parameters)) +
        micro_batches * d(static_cast<std::int64_t>(e.disk_gradients));
    const double parameters = d(static_cast<std::int64_t>(e.disk_parameters));
    const double trainable = d(static_cast<std::int64_t>(e.disk_trainable_parameters));
    // The gathers' reads as the chunk cache replayed them (the replay's micro-batches are the
    // step's, up to 64), else two a micro-batch (forward, backward); the update reads the
    // trainable ones once more.
    const double gathers =
        e.disk_gather_reads > 0
            ? d(static_cast<std::int64_t>(e.disk_gather_reads)) *
                  std::max(1.0, micro_batches / std::clamp(micro_batches, 1.0, 64.0))
            : 2.0 * micro_batches * parameters;
    plan.disk_gradient_read_ahead_bytes = e.gradient_read_ahead;
    plan.disk_read_bytes_per_step = to_bytes(optimizer_chunks + gathers + trainable -
                                             d(static_cast<std::int64_t>(e.gradient_read_ahead)));
    plan.disk_write_bytes_per_step = to_bytes(optimizer_chunks + trainable);
    plan.disk_bytes_per_step = plan.disk_read_bytes_per_step + plan.disk_write_bytes_per_step;
    // Several ranks: each reads and writes back its own optimizer shards once in the update;
    // the ranks of this machine update at the same time, so they share the disk's speed.
    const std::string traffic =
        std::string(distributed ? "disk I/O per step of each rank: " : "disk I/O per step: ") +
        gib(plan.disk_bytes_per_step) + " (" + gib(plan.disk_read_bytes_per_step) + " read, " +
        gib(plan.disk_write_bytes_per_step) + " written" +
        (!distributed            ? ""
         : e.disk_parameters > 0 ? ": its parameter shards read whenever their chunk is "
                                   "gathered, and with its optimizer shards read and written "
                                   "back in the update"
                                 : ": its optimizer shards on disk, read and written back in "
                                   "the update") +
        ")";
    if (hw.disk && hw.disk->measured && hw.disk->read_bytes_per_s > 0 &&
        hw.disk->write_bytes_per_s > 0) {
      const double sharing = distributed ? d(per_node) : 1.0;
      plan.disk_seconds_per_step =
          sharing *
          (d(static_cast<std::int64_t>(plan.disk_read_bytes_per_step)) / hw.disk->read_bytes_per_s +
           d(static_cast<std::int64_t>(plan.disk_write_bytes_per_step)) /
               hw.disk->write_bytes_per_s);
      // One process, full fine-tuning, parameters in memory on the CPU: the plugin runs the
      // update behind the next forward (gemini_plugin.cpp, start_pipelined_update), so the
      // forward's share of the compute (its FLOPs: 2 of 6 per parameter and token, of 8 with
      // recomputation) hides as much of the I/O.
      const bool behind_forward = !distributed && !gpu && s.method != "lora" &&
                                  e.disk_parameters == 0 && s.strategy == "gemini";
      const double forward_seconds = behind_forward ? plan.modelled_seconds_per_step * 2.0 /
                                                          (s.activation_checkpointing ? 8.0 : 6.0)
                                                    : 0.0;
      const double hidden = std::min(plan.disk_seconds_per_step, forward_seconds);
      if (!distributed) {  // several ranks: added after their compute and communication, below
        plan.seconds_per_step += plan.disk_seconds_per_step - hidden;
        plan.modelled_seconds_per_step += plan.disk_seconds_per_step - hidden;
      }
      plan.reasons.push_back(
          traffic +
          (distributed ? ", × " + std::to_string(per_node) +
                             " ranks of this machine updating at once on one disk"
                       : std::string()) +
          ", " + std::to_string(plan.disk_seconds_per_step).substr(0, 5) +
          " s at the measured speed, added to the compute time: " +
          (e.disk_parameters > 0 ? "parameter chunks are read in every forward and backward, "
                                   "optimizer chunks in the update"
           : behind_forward      ? "the update runs behind the next forward, which hides " +
                                  seconds_text(hidden) + " of it"
                            : "it overlaps the optimizer update, not the forward and backward"));
    } else {
      plan.reasons.push_back(traffic +
                             "; the disk speed was not measured, so the time leaves it out "
                             "(tessera-cli plan --measure-disk measures the output folder's disk)");
    }
  }
  // gemini's device tier: the CPU Adam updates the optimizer shards in host memory and on disk
  // after the backward, each rank its share, the ranks of this machine sharing the cores.
  // ZeRO-Offload on a GPU: all of each rank's share. One process of gemini, full fine-tuning with
  // no parameter shard on disk: the update of the shards in host memory (not on disk) runs
  // behind the next forward (the plugin's pipelined update), the forward's share of the compute
  // (its FLOPs: 2 of 6 per parameter and token, of 8 with recomputation) hiding as much of it;
  // on several ranks it does too, which the time leaves in (an upper bound).
  const bool zero_offload = s.strategy == "zero" && s.zero_offload && gpu;
  const double host_optim_share = s.device_tier  ? s.host_optim_frac + s.offload_optim_frac
                                  : zero_offload ? 1.0
                                                 : 0.0;
  if (host_optim_share > 0.0) {
    const double elements = host_optim_share * d(plan.trainable_parameters) / d(processes);
    char count[48];
    std::snprintf(count, sizeof count, "%.1f M", elements / 1e6);
    const std::string what = std::string("the CPU Adam updates ") + count +
                             " elements of optimizer state in host memory" +
                             (zero_offload ? "" : " and on disk") +
                             (distributed ? " on each rank" : "") + " after the backward";
    if (hw.cpu_adam_elements_per_s > 0.0) {
      plan.host_update_seconds_per_step = elements * d(per_node) / hw.cpu_adam_elements_per_s;
      const bool behind_forward = s.device_tier && !distributed && s.method != "lora" &&
                                  s.offload_param_frac == 0.0 && s.host_optim_frac > 0.0;
      const double behind =
          behind_forward ? plan.host_update_seconds_per_step * s.host_optim_frac / host_optim_share
                         : 0.0;
      const double hidden =
          std::min(behind, compute_seconds * 2.0 / (s.activation_checkpointing ? 8.0 : 6.0));
      if (!distributed) {  // several ranks: added after their compute and communication, below
        plan.seconds_per_step += plan.host_update_seconds_per_step - hidden;
        plan.modelled_seconds_per_step += plan.host_update_seconds_per_step - hidden;
      }
      plan.reasons.push_back(
          what + ": " + seconds_text(plan.host_update_seconds_per_step) + " at " +
          std::to_string(static_cast<std::int64_t>(hw.cpu_adam_elements_per_s / 1e6)) +
          " M elements/s" +
          (distributed ? " shared by the " + std::to_string(per_node) + " ranks of this machine"
                       : std::string()) +
          " (" + hw.cpu_adam_source + "), added to the step" +
          (behind_forward ? " less " + seconds_text(hidden) +
                                " that the next forward hides (the update of the shards in host "
                                "memory runs behind it)"
                          : ""));
    } else {
      plan.reasons.push_back(what +
                             "; the CPU Adam's rate was not measured, so the time leaves "
                             "it out");
    }
  }
  const std::optional<DeviceCopies> copies = device_tier_copies(plan, s, hw, processes);
  if (copies && !distributed) add_exposed_copies(plan, *copies, compute_seconds);
  if (distributed) {
    plan_rank_time(plan, in, step_time_device(hw, gpu), layers, flops, rank_flops, tokens,
                   rank_tokens(s), communication_of(s));
    // What the ranks' step adds beside its compute and communication, unless a run of as many
    // ranks measured the step whole.
    const bool measured_with_ranks = plan.calibration && plan.calibration->key.processes > 1;
    const double rank_compute_seconds = plan.modelled_seconds_per_step;
    for (const auto& [seconds, what] :
         {std::pair{plan.disk_seconds_per_step, "disk I/O"},
          std::pair{plan.host_update_seconds_per_step, "the CPU Adam"}})
      if (seconds > 0.0 && !measured_with_ranks) {
        plan.seconds_per_step += seconds;
        plan.modelled_seconds_per_step += seconds;
        plan.time_source += ", plus " + seconds_text(seconds) + " of " + what;
      }
    if (copies && !measured_with_ranks) add_exposed_copies(plan, *copies, rank_compute_seconds);
  } else {
    calibrate(plan, in, step_time_device(hw, gpu), layers, flops);
  }
  for (Plan::Alternative& a : plan.alternatives) {
    a.seconds_per_step =
        modelled_step_seconds(a.settings, model_work(c, a.settings, tokens), tokens, layers, flops);
    const bool quantized = a.settings.quantize != "none" && s.quantize == "none";
    a.summary = method_phrase(a.settings) +
                (a.settings.on_gpu ? " with everything on the GPU" : " with everything in RAM") +
                " would fit too: " + gib(a.peak) + " peak, about " +
                std::to_string(a.seconds_per_step).substr(0, 5) +
                " s per step (this plan: " + std::to_string(plan.seconds_per_step).substr(0, 5) +
                " s); " +
                (quantized ? "its frozen base is held in " + a.settings.quantize + ", not in " +
                                 s.precision + " — the method changes"
                           : std::string("it trains far fewer weights"));
    plan.reasons.push_back("alternative: " + a.summary);
  }
  if (spec.training.steps) {
    plan.total_steps = *spec.training.steps;
    plan.steps_source = "training.steps";
  } else if (spec.training.epochs && in.dataset_rows) {
    // Packed text: blocks of max_length from the sampled tokens per row, not one per row.
    // The run holds out ceil(rows × validation_split) rows (data/split.h).
    const double held_out = std::ceil(d(*in.dataset_rows) * spec.dataset.validation_split);
    const double rows = (d(*in.dataset_rows) - held_out) *
                        (in.packed_rows_per_block ? 1.0 / *in.packed_rows_per_block : 1.0);
    // A step trains batch × accumulation sequences on each data-parallel replica: every rank of
    // ddp, zero and sharded gemini, each tp × pp group of hybrid.
    const std::int64_t replicas = distributed ? replicas_of(s, processes) : 1;
    plan.total_steps = static_cast<std::int64_t>(
        std::ceil(std::ceil(rows / d(batch * spec.training.gradient_accumulation * replicas)) *
                  *spec.training.epochs));
    plan.steps_source = in.packed_rows_per_block
                            ? "epochs × training rows packed into max_length blocks (tokens per "
                              "row from a sample)"
                            : "epochs × training rows (lines of the training files)";
  }
  if (plan.total_steps)
    if (const auto warning = job::warmup_warning(spec.training.warmup_steps, *plan.total_steps,
                                                 spec.training.learning_rate))
      plan.reasons.push_back("warning: " + *warning);

  {
    // A batch's forward against the step, by the cost model (a small model's step is mostly
    // per-op costs, the optimizer's among them: a third of it overstated evaluations 1.6x).
    const StepWork work = model_work(c, s, tokens);
    const double step = modelled_step_seconds(s, work, tokens, layers, chosen_flops);
    const double forward = modelled_forward_seconds(s, work, tokens, layers, chosen_flops);
    // Without a rate: a micro-batch's forward as a third of its forward and backward.
    const double share = step > 0.0
                             ? forward / step
                             : 1.0 / 3.0 / d(std::max<std::int64_t>(1, s.gradient_accumulation));
    plan_evaluations(plan, in, distributed ? replicas_of(s, processes) : 1, share);
  }

  const std::uint64_t peak = tier.estimate.peak();
  const std::string budget = gib(tier.budget) + (tier.simulated ? " (simulated)" : "");
  const std::string method = method_phrase(s);
  if (plan.fits && distributed)
    plan.explanation = method + " in " + s.precision + " as " + std::to_string(processes) +
                       " processes with " + strategy_phrase(s) + ", micro-batch " +
                       std::to_string(s.micro_batch) + " per rank" +
                       (s.activation_checkpointing ? " with activation checkpointing" : "") + ": " +
                       gib(peak) + " per rank of the " + budget + " each of the " +
                       std::to_string(per_node) + " ranks on this machine may use.";
  else if (plan.fits)
    plan.explanation =
        method + " in " + s.precision + " on the " +
        (gpu ? std::string("GPU") : std::string("CPU")) + ", micro-batch " +
        std::to_string(s.micro_batch) +
        (s.activation_checkpointing ? " with activation checkpointing" : "") +
        (s.device_tier ? ", gemini keeping " + in_host_phrase(s) + " in host memory"
                       : std::string()) +
        (disk_bytes > 0 ? ", " + on_disk_phrase(s) + " on disk (" + gib(disk_bytes) + ")"
                        : std::string()) +
        ": " + gib(peak) + " of " + budget + ".";
  else
    plan.explanation = "out of memory: this job does not fit in " + budget + " even with " +
                       "micro-batch 1, activation checkpointing and LoRA; " + plan.what_would_fit +
                       ".";
  // auto's options are single's: another strategy chosen leaves them (said, not silent).
  if (!named && spec.strategy.options.contains("frozen_tables") && s.strategy != "single")
    plan.reasons.push_back(
        "warning: strategy.options.frozen_tables is single's option, and the "
        "plan chose strategy " +
        s.strategy + ", which leaves LoRA's frozen tables in the checkpoint file");
  // A named strategy's run trains the spec as written (auto's applies the plan): where the
  // plan's settings differ from it, they are what the planner would choose, and it says so
  // first (it showed them as the job's).
  if (named && plan.fits) {
    const std::vector<std::string> changes = applied_changes(spec, s);
    std::string listed;
    for (const std::string& change : changes) listed += (listed.empty() ? "" : "; ") + change;
    if (!changes.empty()) {
      plan.explanation = "strategy " + spec.strategy.name +
                         " trains the spec as written; the planner would choose " +
                         plan.explanation;
      plan.reasons.insert(plan.reasons.begin(),
                          "warning: these settings differ from the spec's (" + listed +
                              "), and a named strategy's run does not apply them: write them "
                              "into the spec, or name strategy auto");
    }
  }
  return plan;
}

std::string change_after_device_shortfall(PlanInputs in, std::uint64_t needed) {
  const job::JobSpec spec = in.spec;
  // Several processes: one rank's device, as make_plan plans each rank.
  const int processes = std::max(1, in.processes);
  const int per_node =
      in.processes_per_node > 0 ? std::min(in.processes_per_node, processes) : processes;
  const bool simulated =
      spec.strategy.name == "gemini" &&
      job::strategy_option("gemini", spec.strategy.options, "device") == "simulated";
  if (!simulated && !plans_on_gpu(spec, in.profile, processes, per_node)) return {};
  // What the plan gives the device for the job as it ran (its own figure where it plans the job
  // as written), and the device's budget.
  const Plan as_planned = make_plan(in);
  std::uint64_t planned = 0;
  if (as_planned.fits && applied_changes(spec, as_planned.settings).empty() &&
      !as_planned.tiers.empty() && as_planned.tiers[0].tier == "device") {
    planned = as_planned.tiers[0].estimate.peak();
  } else {
    Settings as_run = written_settings(spec, std::max(1, static_cast<int>(in.profile.gpus.size())),
                                       processes, per_node);
    as_run.on_gpu = true;
    if (as_run.precision == "bf16" && !simulated && !in.profile.gpus[0].bf16)
      as_run.precision = "fp32";
    planned = estimate_memory(in.model, as_run, in.checkpoint_bytes, processes).peak();
  }
  const std::optional<std::uint64_t> device_budget =
      spec.strategy.name == "gemini" ? size_option(spec.strategy.options, "device_budget")
                                     : std::nullopt;
  std::uint64_t budget = simulated ? device_budget.value_or(0) : in.profile.gpus[0].memory;
  if (!simulated && device_budget && *device_budget > 0) budget = std::min(budget, *device_budget);
  if (planned == 0 || budget == 0) return {};
  const double factor =
      std::max(1.0, static_cast<double>(std::max(needed, budget)) / static_cast<double>(planned));
  const auto smaller = static_cast<std::uint64_t>(static_cast<double>(budget) / factor);
  if (simulated || device_budget) in.spec.strategy.options["device_budget"] = smaller;
  for (GpuInfo& gpu : in.profile.gpus) gpu.memory = std::min(gpu.memory, smaller);
  std::ostringstream why;
  why.precision(3);
  if (static_cast<double>(planned) > static_cast<double>(budget) * (1.0 - kHeadroom))
    why << "the plan's estimate for this job (" << core::human_bytes(planned)
        << ") is more than the device's " << core::human_bytes(budget) << " leaves after "
        << static_cast<int>(kHeadroom * 100) << "% headroom: it ran as written";
  else
    why << "the device needed at least " << factor << "× the plan's estimate for this job ("
        << core::human_bytes(planned) << " of " << core::human_bytes(budget) << ")";
  const Plan again = make_plan(in);
  if (!again.fits)
    return why.str() + ", and planned for " + core::human_bytes(smaller) +
           " nothing fits: " + again.explanation;
  const std::vector<std::string> changes = applied_changes(spec, again.settings);
  if (changes.empty())
    return why.str() + "; the plan for " + core::human_bytes(smaller) +
           " changes nothing the spec sets: " +
           "give the device more memory, or lower the batch size";
  std::string hint = why.str() + "; the plan's smallest change that fits (planned for " +
                     core::human_bytes(smaller) + "): ";
  for (std::size_t i = 0; i < changes.size(); ++i) hint += (i ? "; " : "") + changes[i];
  return hint + " (`tessera-cli plan` of the changed spec shows it)";
}

void check_hybrid(const job::JobSpec& spec, int world_size, const hf::ModelConfig* config) {
  const int tp = job::hybrid_tensor_parallel_size(spec.strategy.options);
  const int pp = job::hybrid_pipeline_parallel_size(spec.strategy.options);
  if (world_size % (tp * pp) != 0) {
    const std::string sizes = pp == 1 ? "tp_size: " + std::to_string(tp)
                                      : "tp_size × pp_size: " + std::to_string(tp) + " × " +
                                            std::to_string(pp) + " = " + std::to_string(tp * pp);
    throw_invalid("strategy.options." + sizes + " does not divide the job's " +
                      std::to_string(world_size) + " processes",
                  "launch a multiple of " + std::to_string(tp * pp) +
                      " processes (--nproc), or choose sizes whose product divides " +
                      std::to_string(world_size));
  }
  const int chunks = job::hybrid_pipeline_chunks(spec.strategy.options);
  if (chunks > 1) {
    if (pp == 1)
      throw_invalid("strategy.options.pp_chunks: " + std::to_string(chunks) +
                        " chunks per stage need pipeline stages, but pp_size is 1",
                    "set pp_size to 2 or more, or pp_chunks to 1");
    const std::int64_t accumulation = spec.training.gradient_accumulation;
    if (accumulation % pp != 0)
      throw_invalid(
          "training.gradient_accumulation: the interleaved pipeline schedule runs "
          "micro-batches in groups of pp_size (" +
              std::to_string(pp) + "), and " + std::to_string(accumulation) +
              " is not a multiple of it",
          "set gradient_accumulation to a multiple of " + std::to_string(pp) +
              ", or pp_chunks to 1");
  }
  if (job::hybrid_sequence_parallel(spec.strategy.options) && tp == 1)
    throw_invalid(
        "strategy.options.sequence_parallel: it splits the positions over the tensor "
        "group, but tp_size is 1",
        "set tp_size to 2 or more, or sequence_parallel to false");
  if (config == nullptr || (tp == 1 && pp == 1)) return;
  if (tp > 1) hf::check_tensor_parallel(*config, tp);
  if (pp > 1) hf::check_pipeline_parallel(*config, pp * chunks);
}

std::optional<BudgetRefusal> check_host_budget(const PlanInputs& in) {
  const job::JobSpec& spec = in.spec;
  if (spec.strategy.name != "gemini") return std::nullopt;
  const std::optional<std::uint64_t> host_budget =
      size_option(spec.strategy.options, "host_budget");
  if (!host_budget) return std::nullopt;
  const std::uint64_t budget = *host_budget;
  const std::uint64_t usable =
      static_cast<std::uint64_t>(static_cast<double>(budget) * (1.0 - kHeadroom));
  const Settings s = written_settings(spec, static_cast<int>(in.profile.gpus.size()));
  if (s.device_tier) return std::nullopt;  // host_budget sizes the CPU's chunk cache
  const MemoryEstimate e = estimate_memory(in.model, s, in.checkpoint_bytes);
  if (e.peak() <= usable) return std::nullopt;
  BudgetRefusal r;
  r.message = "strategy.options.host_budget: " + gib(budget) + " leaves " + gib(usable) +
              " after " + std::to_string(static_cast<int>(kHeadroom * 100)) +
              "% headroom, but this job needs about " + gib(e.peak()) + " on the host" +
              (e.peak() == e.load_peak ? " while loading" : "") + " (weights " + gib(e.weights) +
              ", gradients " + gib(e.gradients) + ", optimizer state " + gib(e.optimizer) +
              ", activations " + gib(e.activations) + ", runtime " + gib(e.runtime) + ")";
  // The nearest setting that fits: more of the optimizer state on disk, then checkpointing,
  // then smaller micro-batches with the same optimizer step; only when none of those does,
  // parameter chunks on disk too (read again in every forward and backward), with all of the
  // optimizer state there.
  const std::int64_t batch = s.micro_batch;
  auto nearest = [&](const std::vector<double>& optim_fracs,
                     const std::vector<double>& param_fracs) -> std::optional<std::string> {
    for (bool ckpt : {s.activation_checkpointing, true})
      for (std::int64_t mb = batch; mb >= 1; --mb) {
        if (batch % mb != 0) continue;
        for (double param : param_fracs) {
          if (param < s.offload_param_frac) continue;
          for (double optim : optim_fracs) {
            if (optim < s.offload_optim_frac) continue;
            Settings t = s;
            t.activation_checkpointing = ckpt;
            t.micro_batch = mb;
            t.gradient_accumulation = s.gradient_accumulation * (batch / mb);
            t.offload_optim_frac = optim;
            t.offload_param_frac = param;
            const std::uint64_t need = estimate_memory(in.model, t, in.checkpoint_bytes).peak();
            if (need > usable) continue;
            return "offload_optim_frac " + std::to_string(optim).substr(0, 4) +
                   (param > 0.0 ? ", offload_param_frac " + std::to_string(param).substr(0, 4)
                                : std::string()) +
                   (mb != batch
                        ? ", batch_size " + std::to_string(mb) + " with gradient_accumulation " +
                              std::to_string(t.gradient_accumulation)
                        : std::string()) +
                   (ckpt && !s.activation_checkpointing ? ", activation checkpointing" : "") +
                   " would need about " + gib(need) + "; or give a larger host_budget";
          }
        }
      }
    return std::nullopt;
  };
  auto hint = nearest({s.offload_optim_frac, 0.25, 0.5, 0.75, 1.0}, {s.offload_param_frac});
  if (!hint) hint = nearest({1.0}, {0.25, 0.5, 0.75, 1.0});
  if (hint) {
    r.hint = *hint;
    return r;
  }
  r.hint =
      "nothing fits in this budget with gemini, even with all of the optimizer state and "
      "the parameters on disk (offload_optim_frac 1, offload_param_frac 1); give at least " +
      gib(to_bytes(static_cast<double>(e.peak()) / (1.0 - kHeadroom))) +
      ", use LoRA, or a smaller model";
  return r;
}

}  // namespace tessera::plan
