#include "train/trainer.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/files.h"
#include "core/meminfo.h"
#include "dist/parallel_context.h"
#include "job/job_spec.h"
#include "job/strategies.h"
#include "model/dropout.h"
#include "model/layers.h"
#include "model/quantized_linear.h"
#include "optim/schedule.h"
#include "train/activation_checkpoint.h"
#include "train/checkpoint.h"
#include "train/checkpoint_index.h"
#include "train/device_memory.h"
#include "train/device_tier.h"
#include "train/plugin.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace fs = std::filesystem;

namespace {
constexpr const char* kTrainerState = "trainer_state.json";

// A rank's random state in a checkpoint: rank 0's keeps the one-process name.
std::string rng_file(int rank) {
  return rank == 0 ? "rng_state.safetensors"
                   : "rng_state-rank" + std::to_string(rank) + ".safetensors";
}

const char* layout_name(Plugin::StateLayout layout) {
  return layout == Plugin::StateLayout::Sharded ? "sharded" : "replicated";
}

}  // namespace

std::optional<std::uint64_t> system_memory_used_bytes() {
  const core::MemInfo m = core::read_meminfo();
  if (m.total == 0 || m.available > m.total) return std::nullopt;
  return m.total - m.available;
}

std::uint64_t process_rss_bytes() {
  return core::process_rss();
}

Trainer::Trainer(std::shared_ptr<model::PretrainedModel> model, TrainerOptions options,
                 TrainerEvents* events)
    : model_(std::move(model)), options_(std::move(options)), events_(events) {
  const TrainingOptions& t = options_.training;
  if (t.gradient_accumulation < 1) throw_invalid("training.gradient_accumulation: must be >= 1");
  if (!(t.learning_rate >= 0.0) || !std::isfinite(t.learning_rate))
    throw_invalid("training.learning_rate: must be a finite number >= 0");
  if (!(t.max_grad_norm >= 0.0)) throw_invalid("training.max_grad_norm: must be >= 0");
  if (t.steps && *t.steps < 1) throw_invalid("training.steps: must be >= 1");
  if (t.epochs && !(*t.epochs > 0.0)) throw_invalid("training.epochs: must be > 0");
  optim::schedule_from_name(t.schedule);  // validates the name up front

  torch::manual_seed(t.seed);
  std::vector<NamedTensor> trainable;
  if (options_.method.type == "lora") {
    LoraOptions lora;
    lora.rank = options_.method.lora_rank;
    lora.alpha = options_.method.lora_alpha;
    lora.dropout = options_.method.lora_dropout;
    lora.targets = options_.method.lora_targets;
    lora_ = std::make_unique<LoraModel>(model_, lora);
    if (options_.lora_init)
      lora_->load_adapters(read_safetensors_tensors(*options_.lora_init),
                           options_.lora_init->string());
    trainable = lora_->adapters();
  } else if (options_.method.type == "full") {
    for (const auto& item : model_->named_parameters())
      trainable.push_back({item.key(), item.value()});
  } else {
    throw_invalid("method.type: \"" + options_.method.type + "\" is not a method",
                  "use full or lora");
  }
  plugin_ = make_plugin(options_.plugin);
  if (!options_.method.quantize.empty() ||
      (options_.deferred_weights && options_.deferred_weights->has_stored_quantized()))
    quantize_base();
  PluginOptions plugin_options;
  if (options_.deferred_weights) {
    if (plugin_->reads_deferred_weights()) {
      plugin_options.deferred_weights = options_.deferred_weights;
    } else {
      // LoRA's frozen base under `single` computes in the compute dtype and keeps no float32
      // masters: read straight into it (the cast the plugin would make of a float32 load rounds
      // the same), so the load never holds the base in float32.
      // Its frozen input embedding and output head stay in the checkpoint file, the one read a
      // row per token looked up, the other a block of the vocabulary at a time (the vocabulary's
      // tables: 125 MiB each of a 1.1B llama in bf16, 1 GiB each of Llama 3 8B's).
      // (On a GPU they stay loaded: a step would copy the head to the device block by block.)
      // (Where single computes, decided as the plugin decides it.)
      const bool on_cpu = job::device_for("single", options_.device, 1, 1,
                                          static_cast<int>(torch::cuda::device_count()))
                              .device == "cpu";
      if (lora_ && plugin_->name() == "single" && on_cpu &&
          job::strategy_option("single", options_.strategy_options, "frozen_tables") == "file") {
        const torch::Dtype dtype = compute_dtype_of(precision_from_name(options_.precision));
        const std::vector<std::string> in_file =
            options_.deferred_weights->leave_frozen_tables_in_file(*model_, dtype);
        const auto shapes = model::stored_table_shapes(*model_);
        const auto modules = model_->named_modules("", /*include_self=*/false);
        for (const std::string& name : in_file) {
          const std::vector<std::int64_t>& shape = shapes.at(name);
          const auto* module = modules.find(name.substr(0, name.size() - 7));  // less ".weight"
          const bool head = module != nullptr && (*module)->as<model::LinearImpl>() != nullptr;
          if (events_)
            events_->on_log(
                "info",
                name + " (frozen) stays in the checkpoint file, " +
                    (head ? "read a block of the vocabulary at a time by the loss and the logits: "
                          : "its rows read as batches look them up: ") +
                    core::human_bytes(static_cast<std::uint64_t>(
                        shape[0] * shape[1] * static_cast<std::int64_t>(c10::elementSize(dtype)))) +
                    " not held in memory");
        }
        options_.deferred_weights->load_into(*model_, dtype);
      } else {
        options_.deferred_weights->load_into(*model_);
      }
    }
    options_.deferred_weights.reset();  // the checkpoint's mapping closes after prepare()
  }
  plugin_options.process = options_.process;
  plugin_options.precision = precision_from_name(options_.precision);
  plugin_options.device = options_.device;
  plugin_options.strategy_options = options_.strategy_options;
  plugin_options.run_dir = options_.output_dir;
  plugin_options.adamw = {t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay};
  plugin_options.log = [this](const std::string& level, const std::string& message) {
    if (events_) events_->on_log(level, message);
  };
  plugin_->prepare(*model_, std::move(trainable), plugin_options);
  if (options_.method.preference) prepare_preference();
  if (distributed()) {
    if (options_.process.data_group == nullptr)
      throw Error(ErrorKind::Internal, "trainer: several processes but no data-parallel group");
    // The model and adapters start the same on every rank (seeded above); from here each rank
    // draws its own numbers (dropout), while the data order stays shared.
    torch::manual_seed(t.seed + static_cast<std::uint64_t>(options_.process.rank));
  }
  // Each layer's activations are recomputed in backward instead of kept (grad mode only; the
  // model bypasses the wrapper when it runs with a KV cache).
  if (t.activation_checkpointing) model_->layer_wrapper = &checkpointed;
  model_->train();
}

// QLoRA: the frozen base's Linears quantized before the plugin sees the model, each read straight
// from the checkpoint into its quantized form (the rest loads as usual) — or, from a checkpoint
// that stores them quantized (bitsandbytes), installed with their stored codes.
void Trainer::quantize_base() {
  const MethodOptions& m = options_.method;
  const std::shared_ptr<const model::DeferredWeights>& weights = options_.deferred_weights;
  const bool stored = weights && weights->has_stored_quantized();
  const std::string format_name = stored ? weights->stored_quantization().format : m.quantize;
  const std::string what =
      stored ? "the checkpoint's base, stored " + weights->stored_quantization().describe() + ","
             : "method.quantize \"" + m.quantize + "\"";
  if (m.type != "lora")
    throw_invalid(
        what + " is a quantized frozen base for LoRA, and method.type is \"" + m.type + "\"",
        stored ? "set method.type to lora (QLoRA), or start from the model's unquantized "
                 "checkpoint"
               : "set method.type to lora (QLoRA), or remove method.quantize");
  if (stored && !m.quantize.empty() && m.quantize != format_name)
    throw_invalid(
        "method.quantize: \"" + m.quantize + "\", but " + what + " is quantized already",
        "remove method.quantize (the base trains as stored) or set it to \"" + format_name + "\"");
  // The quantized base is frozen and every rank quantizes the same checkpoint the same way, so
  // the plugins that replicate the frozen weights (and shard only the adapters' state) take it as
  // it is, and gemini keeps it beside its chunks; hybrid's split layers do not hold quantized
  // weights yet.
  const std::string& plugin = plugin_->name();
  if (!job::strategy_can(plugin, &job::StrategyInfo::quantized_base))
    throw_unsupported(
        "QLoRA (" + what + ") under strategy \"" + plugin + "\" is not supported yet",
        "use strategy " + job::strategies_that_can(&job::StrategyInfo::quantized_base));
  // On a GPU the quantized weights move there with their layers (LinearImpl::to under single,
  // ddp and zero; gemini's device tier moves them itself); the tests' simulated device computes
  // on the CPU, where they stay.
  std::vector<std::string> names;
  if (stored) {
    names = weights->install_stored_quantized(*model_);
  } else {
    model::QuantizeOptions q;
    q.format = model::quantized_format_from_name(m.quantize, "method.quantize");
    q.double_quant = m.double_quant;
    names = model::quantize_linears(*model_, weights.get(), q);
  }
  if (events_)
    events_->on_log(
        "info", (stored ? "read " + std::to_string(names.size()) + " linear weights stored " +
                              weights->stored_quantization().describe()
                        : "quantized " + std::to_string(names.size()) + " linear weights to " +
                              m.quantize + (m.double_quant ? " (double-quantized absmax)" : "")) +
                    " (" + core::human_bytes(model::quantized_weight_bytes(*model_)) + ")");
}

// Preference tuning: the strategies it runs under so far, and the reference of DPO / IPO placed
// beside the model (LoRA without a named reference: the model with its adapters off).
void Trainer::prepare_preference() {
  const PreferenceOptions& p = *options_.method.preference;
  validate(p, "method.preference");
  const std::string& plugin = plugin_->name();
  if (!job::strategy_can(plugin, &job::StrategyInfo::preference))
    throw_unsupported("preference tuning (method.preference.loss \"" +
                          std::string(preference_loss_name(p.loss)) + "\") under strategy \"" +
                          plugin + "\" is not supported yet",
                      "use strategy " + job::strategies_that_can(&job::StrategyInfo::preference));
  if (!p.needs_reference()) return;
  if (options_.reference_model) {
    torch::NoGradGuard no_grad;
    reference_ = std::move(options_.reference_model);
    reference_->to(plugin_->device(), plugin_->compute_dtype());
    for (auto& parameter : reference_->parameters()) parameter.set_requires_grad(false);
    reference_->eval();
  } else if (!lora_) {
    throw Error(ErrorKind::Internal,
                "trainer: full fine-tuning with a reference objective but no reference model");
  }
}

Trainer::~Trainer() {
  if (options_.training.activation_checkpointing) model_->layer_wrapper = nullptr;
}

std::int64_t Trainer::total_steps_for(const BatchSource& train) const {
  const TrainingOptions& t = options_.training;
  if (t.steps) return *t.steps;
  // Several data-parallel ranks read as many micro-batches per accumulation step between them.
  const std::int64_t batches = std::max<std::int64_t>(1, train.batches_per_epoch() / data_ranks());
  const std::int64_t per_epoch = std::max<std::int64_t>(1, batches / t.gradient_accumulation);
  const double epochs = t.epochs ? *t.epochs : 1.0;
  const double steps = std::ceil(epochs * static_cast<double>(per_epoch));
  if (!(steps < 1e15)) throw_invalid("training.epochs: too many steps");
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(steps));
}

std::optional<MeshShape> Trainer::mesh_shape() const {
  const ProcessContext& p = options_.process;
  if (p.tensor_group == nullptr && p.pipeline_group == nullptr) return std::nullopt;
  return MeshShape{p.tensor_group ? p.tensor_group->size() : 1,
                   p.pipeline_group ? p.pipeline_group->size() : 1};
}

int Trainer::data_rank() const {
  return distributed() ? options_.process.data_group->rank() : 0;
}

std::int64_t Trainer::sequences_per_step(const BatchSource& train) const {
  return train.rows_per_batch() * options_.training.gradient_accumulation * data_ranks();
}

int Trainer::data_ranks() const {
  return distributed() ? options_.process.data_group->size() : 1;
}

model::ForwardInput Trainer::input_of(const Batch& batch) const {
  model::ForwardInput in;
  const torch::Device device = plugin_->device();
  in.input_ids = batch.input_ids.to(device);
  in.attention_mask =
      batch.attention_mask.defined() ? batch.attention_mask.to(device) : torch::Tensor();
  in.labels = batch.labels.defined() ? batch.labels.to(device) : batch.input_ids.to(device);
  // Training and evaluation read the loss (and a classifier's logits, which this leaves);
  // preference tuning asks for its per-token log-probabilities instead (log_probs_of).
  in.logits = false;
  return in;
}

model::DropoutStream Trainer::dropout_stream(std::int64_t step, std::int64_t first_row) const {
  // Under tensor parallelism this rank holds its tensor rank's block of each layer's heads.
  const std::int64_t head_block =
      options_.process.tensor_group ? options_.process.tensor_group->rank() : 0;
  const std::int64_t blocks =
      options_.process.tensor_group ? options_.process.tensor_group->size() : 1;
  return {options_.training.seed, step, first_row, 0, head_block, blocks};
}

model::ForwardOutput Trainer::forward_batch(const Batch& batch) {
  model::ForwardOutput out = model_->forward(input_of(batch));
  if (!out.loss.defined())
    throw_invalid("training: the model computed no loss for a batch",
                  "the model needs a head with a loss (causal LM or classification)");
  return out;
}

double Trainer::loss_targets(const Batch& batch) const {
  // Preference and classification losses are means over rows (pairs, sequences).
  if (options_.method.preference || model_->head() == model::TaskHead::SequenceClassification ||
      !batch.input_ids.defined() || batch.input_ids.size(1) < 2)
    return static_cast<double>(batch.input_ids.size(0));
  // A causal LM's: over the positions whose next token is a label (the model's shift).
  const torch::Tensor& labels = batch.labels.defined() ? batch.labels : batch.input_ids;
  return static_cast<double>(
      labels.narrow(1, 1, labels.size(1) - 1).ne(-100).sum().item<std::int64_t>());
}

torch::Tensor Trainer::train_micro_batch(const Batch& batch, double multiplier,
                                         bool last_micro_batch, std::int64_t step,
                                         std::int64_t first_row) {
  model::DropoutScope dropout_scope(dropout_stream(step, first_row));
  torch::Tensor loss;
  if (options_.method.preference) {
    PreferenceBatchLoss pairs = preference_batch_loss(batch);
    step_preference_ += pairs.sums;
    loss = pairs.loss;
  } else {
    loss = forward_batch(batch).loss;
  }
  plugin_->backward(loss, multiplier, last_micro_batch);
  return loss.detach().to(torch::kFloat64);
}

namespace {

// Each position's log-probability of the token after it in `targets` [rows, T] (labels, or the
// input ids), [rows, T − 1] float32: the model computes it through its head a block of positions
// at a time, holding no [rows, T, vocab] logits where its head allows.
torch::Tensor log_probs_of(model::PretrainedModel& model, model::ForwardInput input,
                           const torch::Tensor& targets) {
  input.labels = targets;
  input.label_log_probs = true;
  return model.forward(input).label_log_probs;
}

// Each row's summed log-probability of the tokens `labels` keeps, and their count.
SequenceLogProbs sequence_log_probs_of(model::PretrainedModel& model,
                                       const model::ForwardInput& input,
                                       const torch::Tensor& labels) {
  return labelled_sums(log_probs_of(model, input, labels), labels);
}

}  // namespace

SequenceLogProbs Trainer::reference_log_probs(const model::ForwardInput& input,
                                              const torch::Tensor& labels) {
  torch::NoGradGuard no_grad;
  if (reference_) return sequence_log_probs_of(*reference_, input, labels);
  // The model with its adapters off is the base it started from; in eval mode, as a separate
  // reference model runs, so its log-probabilities draw no dropout.
  struct AdaptersOff {
    LoraModel& lora;
    model::PretrainedModel& model;
    bool training;
    ~AdaptersOff() {
      lora.refresh();
      if (training) model.train();
    }
  } off{*lora_, *model_, model_->is_training()};
  lora_->detach();
  model_->eval();
  return sequence_log_probs_of(*model_, input, labels);
}

PreferenceBatchLoss Trainer::preference_batch_loss(const Batch& batch) {
  const PreferenceOptions& p = *options_.method.preference;
  const model::ForwardInput input = input_of(batch);
  const torch::Tensor labels = input.labels;
  if (p.unpaired()) return kto_batch_loss(batch, input, labels);
  SequenceLogProbs reference;
  if (p.needs_reference()) reference = reference_log_probs(input, labels);
  if (p.loss == PreferenceLoss::Orpo) {
    // One forward for both sums: the completions', and the chosen sequences' whole (the NLL
    // term, the prompt included as TRL computes it), from the log-probabilities of every input
    // token (the labels equal them wherever they keep a token).
    const torch::Tensor log_probs = log_probs_of(*model_, input, input.input_ids);
    const std::int64_t pairs = input.input_ids.size(0) / 2;
    const SequenceLogProbs chosen_sequences =
        labelled_sums(log_probs.narrow(0, 0, pairs),
                      whole_sequence_labels(input.input_ids.narrow(0, 0, pairs),
                                            input.attention_mask.defined()
                                                ? input.attention_mask.narrow(0, 0, pairs)
                                                : torch::Tensor()));
    return preference_loss(p, labelled_sums(log_probs, labels), nullptr, &chosen_sequences);
  }
  return preference_loss(p, sequence_log_probs_of(*model_, input, labels),
                         p.needs_reference() ? &reference : nullptr);
}

// KTO: the batch's first N rows are its examples, the next N their mismatched rows (the KL term's
// estimate, without gradients, as TRL computes it); the reference runs on all of them.
PreferenceBatchLoss Trainer::kto_batch_loss(const Batch& batch, const model::ForwardInput& input,
                                            const torch::Tensor& labels) {
  const PreferenceOptions& p = *options_.method.preference;
  if (!batch.desirable.defined() || 2 * batch.desirable.size(0) != input.input_ids.size(0))
    throw Error(ErrorKind::Internal,
                "kto: a batch without its desirable flags and mismatched rows");
  const std::int64_t n = batch.desirable.size(0);
  const auto rows = [&](std::int64_t first) {
    model::ForwardInput part = input;
    part.input_ids = input.input_ids.narrow(0, first, n);
    if (input.attention_mask.defined())
      part.attention_mask = input.attention_mask.narrow(0, first, n);
    return part;
  };
  const torch::Tensor example_labels = labels.narrow(0, 0, n);
  const torch::Tensor mismatched_labels = labels.narrow(0, n, n);
  const SequenceLogProbs reference = reference_log_probs(input, labels);
  SequenceLogProbs mismatched;
  {
    torch::NoGradGuard no_grad;
    mismatched = sequence_log_probs_of(*model_, rows(n), mismatched_labels);
  }
  const SequenceLogProbs policy = sequence_log_probs_of(*model_, rows(0), example_labels);
  double kl = (mismatched.sum - reference.sum.narrow(0, n, n)).mean().item<double>();
  if (distributed()) {  // the mean over the data-parallel ranks' batches
    const std::vector<double> all = gather({kl}, /*data_only=*/true);
    kl = 0.0;
    for (const double value : all) kl += value;
    kl /= static_cast<double>(all.size());
  }
  return kto_loss(p, policy, {reference.sum.narrow(0, 0, n), reference.tokens.narrow(0, 0, n)},
                  batch.desirable, std::max(kl, 0.0));
}

PreferenceMetrics Trainer::preference_metrics(const PreferenceSums& sums) {
  PreferenceSums total = sums;
  if (distributed()) {
    const std::vector<double> all =
        gather({sums.pairs, sums.chosen, sums.rejected, sums.reward_chosen, sums.reward_rejected,
                sums.margin, sums.accuracy, sums.log_prob_chosen, sums.log_prob_rejected, sums.kl,
                sums.kl_batches},
               /*data_only=*/true);
    total = {};
    for (std::size_t i = 0; i + 11 <= all.size(); i += 11)
      total += {all[i],     all[i + 1], all[i + 2], all[i + 3], all[i + 4], all[i + 5],
                all[i + 6], all[i + 7], all[i + 8], all[i + 9], all[i + 10]};
  }
  const auto mean = [](double sum, double count) { return count > 0 ? sum / count : 0.0; };
  PreferenceMetrics m;
  const bool unpaired = options_.method.preference->unpaired();
  m.pairs = unpaired ? 0 : static_cast<std::int64_t>(total.pairs);
  m.desirable = unpaired ? static_cast<std::int64_t>(total.chosen) : 0;
  m.undesirable = unpaired ? static_cast<std::int64_t>(total.rejected) : 0;
  m.reward_chosen = mean(total.reward_chosen, total.chosen);
  m.reward_rejected = mean(total.reward_rejected, total.rejected);
  // Pairs: the mean of each pair's margin (as TRL reports it); KTO: the difference of the means.
  m.margin = unpaired ? m.reward_chosen - m.reward_rejected : mean(total.margin, total.pairs);
  if (!unpaired) m.accuracy = mean(total.accuracy, total.pairs);
  m.log_prob_chosen = mean(total.log_prob_chosen, total.chosen);
  m.log_prob_rejected = mean(total.log_prob_rejected, total.rejected);
  if (unpaired) m.kl = mean(total.kl, total.kl_batches);
  return m;
}

EvalResult Trainer::evaluate(BatchSource& source) {
  const DataPosition saved = source.position();
  source.seek({0, 0});
  model_->eval();
  double sum = 0.0;
  std::int64_t right = 0, labelled = 0;
  const bool classification = model_->head() == model::TaskHead::SequenceClassification;
  const std::int64_t n = source.batches_per_epoch();
  // Several data-parallel ranks: rank r evaluates batches r, r + world_size, …; the sums are
  // added up below.
  const int rank = data_rank();
  const int world_size = data_ranks();
  std::int64_t count = 0;
  PreferenceSums preference_sums;
  double seconds = 0.0;  // this rank's forwards, for the plans of later runs (step_times.h)
  std::int64_t batches = 0;
  {
    torch::NoGradGuard no_grad;
    // Every rank runs as many forwards (a plugin that shards the weights gathers them with
    // every rank in each): a rank past the end evaluates batch 0 again and does not count it.
    const std::int64_t rounds = (n + world_size - 1) / world_size;
    // Its progress, at its start and about every second (an evaluation may take a while).
    const auto eval_start = std::chrono::steady_clock::now();
    auto reported = eval_start;
    for (std::int64_t k = 0; k < rounds; ++k) {
      if (events_) {
        const auto now = std::chrono::steady_clock::now();
        if (k == 0 || now - reported >= std::chrono::seconds(1)) {
          std::optional<double> eta;
          if (k > 0)
            eta = std::chrono::duration<double>(now - eval_start).count() / static_cast<double>(k) *
                  static_cast<double>(rounds - k);
          events_->on_progress("eval", k, rounds, eta);
          reported = now;
        }
      }
      const std::int64_t i = rank + k * world_size;
      const bool counted = i < n;
      if (world_size > 1) source.seek({0, counted ? i : 0});
      const Batch batch = source.next();
      if (plugin_->runs_micro_batches()) {
        // The plugin runs the model (a pipeline's stages pass the batch along); causal LMs only.
        const double loss = plugin_->evaluation_loss(input_of(batch));
        if (!counted) continue;
        ++count;
        sum += loss;
        continue;
      }
      if (options_.method.preference) {
        const PreferenceBatchLoss pairs = preference_batch_loss(batch);
        if (!counted) continue;
        ++count;
        sum += pairs.loss.to(torch::kFloat64).item<double>();
        preference_sums += pairs.sums;
        continue;
      }
      model::ForwardOutput out = forward_batch(batch);
      if (!counted) continue;
      ++count;
      sum += out.loss.detach().to(torch::kFloat64).item<double>();
      if (classification) {
        const torch::Tensor predicted = out.logits.argmax(-1).to(torch::kCPU);
        right += predicted.eq(batch.labels.to(torch::kCPU)).sum().item<std::int64_t>();
        labelled += batch.labels.size(0);
      }
    }
    if (events_) events_->on_progress("eval", rounds, rounds, 0.0);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
    batches = rounds;
  }
  model_->train();
  source.seek(saved);
  if (distributed()) {
    const std::vector<double> all =
        gather({sum, static_cast<double>(count), static_cast<double>(right),
                static_cast<double>(labelled)},
               /*data_only=*/true);
    sum = 0.0;
    count = right = labelled = 0;
    for (std::size_t i = 0; i < all.size(); i += 4) {
      sum += all[i];
      count += static_cast<std::int64_t>(all[i + 1]);
      right += static_cast<std::int64_t>(all[i + 2]);
      labelled += static_cast<std::int64_t>(all[i + 3]);
    }
  }
  EvalResult r;
  r.loss = sum / static_cast<double>(count);
  r.seconds = seconds;
  r.batches = batches;
  if (options_.method.preference) {
    r.preference = preference_metrics(preference_sums);
    return r;
  }
  if (classification)
    r.accuracy = labelled > 0 ? static_cast<double>(right) / static_cast<double>(labelled) : 0.0;
  else
    r.perplexity = std::exp(r.loss);
  return r;
}

void Trainer::emit_eval(const EvalResult& r) {
  if (events_) events_->on_eval(r);
}

dist::ProcessGroup& Trainer::world_group() const {
  return options_.process.parallel ? options_.process.parallel->world()
                                   : *options_.process.data_group;
}

std::vector<double> Trainer::gather(const std::vector<double>& values, bool data_only) {
  if (!distributed()) return values;
  const torch::Tensor local = torch::tensor(values, torch::kFloat64);
  dist::ProcessGroup& group = data_only ? *options_.process.data_group : world_group();
  const torch::Tensor all = group.all_gather(local).contiguous();
  const double* data = all.data_ptr<double>();
  return std::vector<double>(data, data + all.numel());
}

CheckpointRanks Trainer::checkpoint_ranks() {
  CheckpointRanks ranks;
  ranks.rank = options_.process.rank;
  ranks.world_size = options_.process.world_size;
  if (!distributed()) return ranks;
  dist::ProcessGroup* group = &world_group();
  ranks.from_rank0 = [group](const std::string& value) {
    // The length first, then the bytes.
    torch::Tensor size = torch::tensor({static_cast<std::int64_t>(value.size())}, torch::kInt64);
    group->broadcast(size, 0);
    torch::Tensor bytes = torch::zeros({size.item<std::int64_t>()}, torch::kUInt8);
    if (group->rank() == 0 && !value.empty())
      std::memcpy(bytes.data_ptr(), value.data(), value.size());
    if (bytes.numel() > 0) group->broadcast(bytes, 0);
    return std::string(reinterpret_cast<const char*>(bytes.data_ptr()),
                       static_cast<std::size_t>(bytes.numel()));
  };
  ranks.all_ok = [this](bool ok) {
    std::vector<bool> oks;
    for (double v : gather({ok ? 1.0 : 0.0})) oks.push_back(v != 0.0);
    return oks;
  };
  return ranks;
}

void Trainer::emit_memory() {
  // Several processes: a collective, so every rank takes part whether it reports or not.
  if (!events_ && !distributed()) return;
  MemoryByCategory m = plugin_->memory();
  // The frozen reference model of preference tuning is weights too.
  if (reference_)
    for (const auto& parameter : reference_->parameters())
      m.weights += static_cast<std::uint64_t>(parameter.nbytes());
  const std::uint64_t rss = process_rss_bytes();
  const std::uint64_t accounted = m.weights + m.gradients + m.optimizer;
  MemoryReport report;
  report.mesh = mesh_shape();
  report.on_device = plugin_->device().is_cuda();
  report.device = plugin_->device().str();
  report.used = rss;
  report.reserved = rss;
  report.by_category = m;
  report.activations_other = rss > accounted ? rss - accounted : 0;
  // On a GPU: the CUDA allocator's bytes (the plugin's state lives there; the rest of what its
  // tensors hold is activations and workspace), and the host's resident set beside it.
  const std::optional<DeviceMemory> gpu = device_memory(plugin_->device());
  // A plugin with a device tier says what it holds there; memory() is then its host share.
  const std::optional<DeviceTierMemory> tier = plugin_->device_tier_memory();
  std::optional<MemoryReport> host;
  if (gpu || tier) {
    // Without a tier the model's state is on the GPU but for what the plugin keeps on the host.
    const MemoryByCategory host_share = tier ? MemoryByCategory{} : plugin_->host_share();
    const auto minus = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; };
    const MemoryByCategory on_device =
        tier ? tier->by_category
             : MemoryByCategory{minus(m.weights, host_share.weights),
                                minus(m.gradients, host_share.gradients),
                                minus(m.optimizer, host_share.optimizer)};
    const std::uint64_t device_accounted =
        on_device.weights + on_device.gradients + on_device.optimizer;
    report.on_device = true;
    report.by_category = on_device;
    if (tier) {
      report.bytes_to_device = tier->bytes_to_device;
      report.bytes_to_host = tier->bytes_to_host;
      report.simulated = tier->simulated;
      report.budget = tier->total;
    }
    if (gpu) {
      report.used = gpu->allocated;
      report.reserved = gpu->reserved;
      report.peak = gpu->peak_allocated;
      report.total = gpu->total;
      report.free = gpu->free;
    } else {  // the simulated device: its own accounting of what the tier allocated
      report.device = tier->device;
      report.used = report.reserved = tier->used;
      report.peak = tier->peak;
      report.total = tier->total;
      report.free = tier->total > tier->used ? tier->total - tier->used : 0;
    }
    report.activations_other = report.used > device_accounted ? report.used - device_accounted : 0;
    host.emplace();
    host->device = "cpu";
    host->used = rss;
    host->reserved = rss;
    // With a tier, memory() is the host's share; without, what the plugin says it keeps there.
    const MemoryByCategory on_host = tier ? m : host_share;
    const std::uint64_t host_accounted = on_host.weights + on_host.gradients + on_host.optimizer;
    host->by_category = on_host;
    host->activations_other = rss > host_accounted ? rss - host_accounted : 0;
    host->system_used = system_memory_used_bytes();
  }
  // What the whole machine uses: other programs' memory pressure next to ours.
  if (!report.on_device) report.system_used = system_memory_used_bytes();
  const std::optional<DiskTierMemory> disk = plugin_->disk_memory();
  // Every rank's disk tier (sharded gemini: each rank's own files) in the same collective.
  std::vector<MemoryReport::Rank> disk_ranks;
  if (distributed()) {
    constexpr std::size_t kFields = 9;
    const DiskTierMemory no_disk;
    const DiskTierMemory& own_disk = disk ? *disk : no_disk;
    const std::vector<double> all =
        // The ranks' figures of this report's tier (the device's, with a device tier).
        gather({static_cast<double>(report.used), static_cast<double>(report.by_category.weights),
                static_cast<double>(report.by_category.gradients),
                static_cast<double>(report.by_category.optimizer),
                static_cast<double>(report.activations_other), static_cast<double>(own_disk.used),
                static_cast<double>(own_disk.by_category.weights),
                static_cast<double>(own_disk.by_category.gradients),
                static_cast<double>(own_disk.by_category.optimizer)});
    for (std::size_t i = 0; i + kFields <= all.size(); i += kFields) {
      MemoryReport::Rank rank;
      rank.rank = static_cast<int>(i / kFields);
      rank.host = options_.process.parallel ? options_.process.parallel->host_of(rank.rank) : "";
      rank.used = static_cast<std::uint64_t>(all[i]);
      rank.by_category = {static_cast<std::uint64_t>(all[i + 1]),
                          static_cast<std::uint64_t>(all[i + 2]),
                          static_cast<std::uint64_t>(all[i + 3])};
      rank.activations_other = static_cast<std::uint64_t>(all[i + 4]);
      MemoryReport::Rank disk_rank;
      disk_rank.rank = rank.rank;
      disk_rank.host = rank.host;
      disk_rank.used = static_cast<std::uint64_t>(all[i + 5]);
      disk_rank.by_category = {static_cast<std::uint64_t>(all[i + 6]),
                               static_cast<std::uint64_t>(all[i + 7]),
                               static_cast<std::uint64_t>(all[i + 8])};
      report.ranks.push_back(std::move(rank));
      disk_ranks.push_back(std::move(disk_rank));
    }
  }
  if (!events_) return;
  events_->on_memory(report);
  if (host) events_->on_memory(*host);
  if (disk) {
    MemoryReport d;
    d.on_disk = true;
    d.device = disk->folder;
    d.used = disk->used;
    d.reserved = disk->used;
    d.by_category = disk->by_category;
    d.bytes_read = disk->bytes_read;
    d.bytes_written = disk->bytes_written;
    const auto now = std::chrono::steady_clock::now();
    if (last_disk_report_) {
      const double seconds = std::chrono::duration<double>(now - last_disk_report_->at).count();
      if (seconds > 0.0) {
        d.read_bytes_per_s =
            static_cast<double>(disk->bytes_read - last_disk_report_->bytes_read) / seconds;
        d.written_bytes_per_s =
            static_cast<double>(disk->bytes_written - last_disk_report_->bytes_written) / seconds;
      }
    }
    last_disk_report_ = DiskSample{now, disk->bytes_read, disk->bytes_written};
    d.ranks = std::move(disk_ranks);
    events_->on_memory(d);
  }
}

fs::path Trainer::save_checkpoint(std::int64_t step, const BatchSource& train,
                                  std::int64_t total_steps) {
  if (options_.output_dir.empty())
    throw_invalid("output.dir: required to save checkpoints", "give an output folder");
  if (events_) events_->on_progress("save", 0, 1, std::nullopt);
  const int rank = options_.process.rank;
  const Plugin::StateLayout layout = plugin_->state_layout();
  const bool sharded = layout == Plugin::StateLayout::Sharded;
  nlohmann::json state = {
      {"step", step},
      {"total_steps", total_steps},
      {"method", options_.method.type},
      {"precision", options_.precision},
      {"schedule", options_.training.schedule},
      {"data",
       {{"epoch", train.position().epoch},
        {"index", train.position().index},
        {"seed", train.order_seed()}}},
      {"plugin", plugin_->name()},
      {"plugin_state", plugin_->state_json()},
      {"world_size", options_.process.world_size},
      // What a step trains, on every data-parallel process together: a resume that trains
      // another number says so.
      {"sequences_per_step", sequences_per_step(train)},
  };
  // Each rank writes only its own files: the replicated state once (rank 0), a sharded one by
  // every rank, and every rank its random state. Every rank lists what it wrote by name and
  // element range, and rank 0 merges the lists into the layout-free index
  // (train/checkpoint_index.h) that any layout resumes from.
  auto write = [&](const fs::path& dir) {
    StateIndexPart index;
    if (sharded) {
      const std::string part = "-rank" + std::to_string(rank) + ".safetensors";
      const std::map<std::string, StateSlice> slices = plugin_->state_slices();
      std::vector<NamedTensor> weights = plugin_->trainable_weights();
      index.add("model", "model" + part, weights, slices);
      write_safetensors_tensors(dir / ("model" + part), std::move(weights));
      std::vector<NamedTensor> optimizer = plugin_->optimizer_state();
      index.add("optimizer", "optimizer" + part, optimizer, slices);
      write_safetensors_tensors(dir / ("optimizer" + part), std::move(optimizer));
    } else {
      // Every rank collects it (a plugin may gather its blocks from the others: hybrid's
      // tensor-parallel weights); rank 0 writes it.
      std::vector<NamedTensor> weights = plugin_->trainable_weights();
      std::vector<NamedTensor> optimizer = plugin_->optimizer_state();
      if (rank == 0) {
        index.add("model", lora_ ? "adapter_model.safetensors" : "model.safetensors", weights);
        if (lora_)
          lora_->save_adapter(dir, options_.base_model_name, &weights);
        else
          write_safetensors_tensors(dir / "model.safetensors", std::move(weights), true,
                                    {{"format", "pt"}});
        index.add("optimizer", "optimizer.safetensors", optimizer);
        write_safetensors_tensors(dir / "optimizer.safetensors", std::move(optimizer));
      }
    }
    index.write(dir, rank);
    std::vector<NamedTensor> rng = {{"torch_cpu", cpu_rng_state()}};
    if (plugin_->device().is_cuda())
      rng.push_back({"torch_cuda", device_rng_state(plugin_->device())});
    write_safetensors_tensors(dir / rng_file(rank), std::move(rng), false);
    if (rank == 0) core::write_file_atomic(dir / kTrainerState, state.dump(2) + "\n");
  };
  const nlohmann::json extra = {{"kind", "tessera-train"},
                                {"world_size", options_.process.world_size},
                                {"state_layout", layout_name(layout)}};
  const int world_size = options_.process.world_size;
  fs::path path =
      write_checkpoint(options_.output_dir, step, write, extra, checkpoint_ranks(),
                       [world_size](const fs::path& dir) { merge_state_index(dir, world_size); });
  // Every rank's part is committed by now: pruning cannot touch a save in progress.
  if (rank == 0) prune_checkpoints(options_.output_dir, options_.training.keep_last, path);
  if (events_) {
    events_->on_checkpoint(step, path);
    events_->on_progress("save", 1, 1, std::nullopt);
  }
  return path;
}

std::int64_t Trainer::restore(BatchSource& train, std::int64_t total_steps) {
  auto log = [&](const std::string& message) {
    if (events_) events_->on_log("warning", message);
  };
  const int rank = options_.process.rank;
  const int world_size = options_.process.world_size;
  // Rank 0 picks the checkpoint (the newest valid one) and every rank reads that one.
  FoundCheckpoint found;
  if (rank == 0) {
    try {
      found = find_resume_checkpoint(*options_.resume, log);
    } catch (...) {
      if (distributed()) checkpoint_ranks().from_rank0("");
      throw;
    }
  }
  if (distributed()) {
    const std::string shared = checkpoint_ranks().from_rank0(
        rank == 0
            ? nlohmann::json{{"path", found.path.string()}, {"manifest", found.manifest}}.dump()
            : std::string());
    if (shared.empty())
      throw_invalid(
          "resume: rank 0 found no checkpoint to resume from in " + options_.resume->string(),
          "rank 0's error says why");
    const nlohmann::json chosen = nlohmann::json::parse(shared);
    found.path = chosen.at("path").get<std::string>();
    found.manifest = chosen.at("manifest");
    found.step = found.manifest.at("step").get<std::int64_t>();
  }
  const std::string source = found.path.string();
  const int saved_world_size = found.manifest.value("world_size", 1);
  const bool saved_sharded = found.manifest.value("state_layout", "replicated") == "sharded";
  // Checkpoints with the layout-free index resume on any layout; older ones as they were saved.
  const std::optional<StateIndex> index = StateIndex::open(found.path);
  if (!index && saved_sharded && saved_world_size != world_size)
    throw_unsupported(source + " holds state sharded over " + std::to_string(saved_world_size) +
                          " ranks; this run has " + std::to_string(world_size) +
                          ", and resharding a checkpoint is not supported yet",
                      "resume with " + std::to_string(saved_world_size) +
                          " processes (tessera-cli launch --nproc " +
                          std::to_string(saved_world_size) + ")");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(core::read_text_file(found.path / kTrainerState));
    if (state.at("method").get<std::string>() != options_.method.type)
      throw_invalid(source + ": the checkpoint was trained with method \"" +
                        state.at("method").get<std::string>() + "\", this run uses \"" +
                        options_.method.type + "\"",
                    "resume with the same method");
    if (state.at("data").at("seed").get<std::uint64_t>() != train.order_seed())
      throw_invalid(source + ": the checkpoint's data order seed differs from this run's",
                    "resume with the same seed");
    if (state.at("total_steps").get<std::int64_t>() != total_steps && events_)
      events_->on_log("warning",
                      "resume: the run length changed from " + state.at("total_steps").dump() +
                          " to " + std::to_string(total_steps) + " steps; the schedule follows it");
    train.seek({state.at("data").at("epoch").get<std::int64_t>(),
                state.at("data").at("index").get<std::int64_t>()});
    if (index) {
      const std::map<std::string, StateSlice> slices = plugin_->state_slices();
      plugin_->load_state(index->read("model", slices), index->read("optimizer", slices),
                          state.at("plugin_state"), source);
    }
    fs::path weights_file =
        found.path / (lora_ ? "adapter_model.safetensors" : "model.safetensors");
    fs::path optimizer_file = found.path / "optimizer.safetensors";
    if (saved_sharded) {
      const std::string part = "-rank" + std::to_string(rank) + ".safetensors";
      weights_file = found.path / ("model" + part);
      optimizer_file = found.path / ("optimizer" + part);
    }
    if (!index)
      plugin_->load_state(read_safetensors_tensors(weights_file),
                          read_safetensors_tensors(optimizer_file), state.at("plugin_state"),
                          source);
    if (rank < saved_world_size) {
      auto rng = read_safetensors_tensors(found.path / rng_file(rank));
      if (!rng.count("torch_cpu"))
        throw_invalid(source + ": " + rng_file(rank) + " lacks torch_cpu");
      set_cpu_rng_state(rng.at("torch_cpu"));
      // A GPU run's dropout stream; a run saved on the CPU and resumed on a GPU (or back) keeps
      // the device's stream as seeded.
      if (rng.count("torch_cuda") && plugin_->device().is_cuda())
        set_device_rng_state(plugin_->device(), rng.at("torch_cuda"));
    } else {
      // A rank the saving run did not have: a stream of its own, as at a start.
      torch::manual_seed(options_.training.seed + static_cast<std::uint64_t>(rank) +
                         static_cast<std::uint64_t>(found.step) * 1000003ULL);
    }
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(source + "/" + kTrainerState + ": invalid (" + e.what() + ")");
  }
  if (events_) {
    events_->on_log("info", "resumed from " + source + " at step " + std::to_string(found.step));
    if (saved_world_size != world_size)
      events_->on_log("info", "resume: the checkpoint was saved by " +
                                  std::to_string(saved_world_size) +
                                  (saved_world_size == 1 ? " process" : " processes") +
                                  ", this run has " + std::to_string(world_size) +
                                  (index ? " (its state is saved by name and element range, "
                                           "so each rank reads what this layout holds)"
                                         : " (its state is replicated, so every rank reads all "
                                           "of it)"));
    const std::int64_t saved_sequences = state.value("sequences_per_step", std::int64_t{0});
    if (saved_sequences > 0 && saved_sequences != sequences_per_step(train))
      events_->on_log(
          "warning",
          "resume: a step of the run before trained " + std::to_string(saved_sequences) +
              " sequences, and this run's steps train " +
              std::to_string(sequences_per_step(train)) + " (" +
              std::to_string(train.rows_per_batch()) + " a micro-batch x gradient_accumulation " +
              std::to_string(options_.training.gradient_accumulation) + " x " +
              std::to_string(data_ranks()) + " data-parallel processes): the steps after " +
              std::to_string(found.step) +
              " differ from the run's own; resume with the processes and batch it had to "
              "continue it as it was");
  }
  return found.step;
}

void Trainer::out_of_device_memory(const std::string& what, const std::string& hint,
                                   std::uint64_t needed, std::int64_t step,
                                   const DataPosition& step_start, const torch::Tensor& cpu_rng,
                                   const torch::Tensor& device_rng, BatchSource& train,
                                   std::int64_t total_steps, bool in_update) {
  std::string message = "training stopped in step " + std::to_string(step + 1) +
                        (in_update ? "'s update" : "") + ": " + what;
  // What the device held then, by category (a plugin with a device tier knows its own).
  if (const std::optional<DeviceTierMemory> tier = plugin_->device_tier_memory())
    message += " (the device held weights " + core::human_bytes(tier->by_category.weights) +
               ", gradients " + core::human_bytes(tier->by_category.gradients) + ", optimizer " +
               core::human_bytes(tier->by_category.optimizer) + ")";
  else if (const std::optional<DeviceMemory> gpu = device_memory(plugin_->device()))
    message += " (" + core::human_bytes(gpu->allocated) + " in tensors, " +
               core::human_bytes(gpu->reserved) + " reserved, " + core::human_bytes(gpu->total) +
               " on the card)";
  // One process: the state is still the last step's (only gradients were being made), so it is
  // saved as that step with the data and random state as the failed step began; several ranks
  // would wait for this one in their collectives, so they end without saving and the message
  // names the checkpoint saved before.
  // In the update the masters and moments may be partly new: nothing is saved then either.
  if (!distributed() && !in_update && !options_.output_dir.empty() && step > 0) {
    train.seek(step_start);
    set_cpu_rng_state(cpu_rng);
    if (device_rng.defined()) set_device_rng_state(plugin_->device(), device_rng);
    const fs::path saved = save_checkpoint(step, train, total_steps);
    message += "; step " + std::to_string(step) + " is saved in " + saved.string() +
               ", resume from it after the change";
  } else if ((distributed() || in_update) && !options_.output_dir.empty()) {
    // The newest complete checkpoint the run saved before (save_steps) is where it resumes.
    message += in_update ? "; the update had begun, so the weights and optimizer state may be "
                           "partly new and nothing is saved at the failure"
                         : "; with several ranks nothing is saved at the failure (the others "
                           "wait for this one in their collectives)";
    try {
      const FoundCheckpoint found =
          find_resume_checkpoint(options_.output_dir, [](const std::string&) {});
      message += ": resume from step " + std::to_string(found.step) + ", saved in " +
                 found.path.string() + ", after the change";
    } catch (const std::exception&) {
      message += ", and the run saved no checkpoint before it";
    }
  }
  throw StepOutOfDeviceMemory(message, hint, needed);
}

TrainResult Trainer::train(BatchSource& train, BatchSource* eval, const std::atomic<bool>* stop) {
  const TrainingOptions& t = options_.training;
  TrainResult result;
  result.total_steps = total_steps_for(train);
  optim::LrSchedule schedule(optim::schedule_from_name(t.schedule), t.learning_rate, t.warmup_steps,
                             result.total_steps);
  std::int64_t step = options_.resume ? restore(train, result.total_steps) : 0;
  result.start_step = step;
  // Warm-up as long as the run is the user's to choose (transformers allows it too), but the
  // learning rate they set is then never reached: say so once, at the start.
  if (events_ && step == 0 && options_.process.rank == 0)
    if (const auto warning =
            job::warmup_warning(t.warmup_steps, result.total_steps, t.learning_rate))
      events_->on_log("warning", *warning);
  model_->train();
  const auto run_start = std::chrono::steady_clock::now();
  // The end of this run's first step: LibTorch's warm-up makes that step several times longer
  // than the others, so the ETA extrapolates from the steps after it (as the plan's calibration
  // does, plan/step_times.h).
  std::optional<std::chrono::steady_clock::time_point> first_step_end;
  // The evaluations during training and the seconds they took: the ETA adds those to come.
  double evaluation_seconds = 0.0;
  std::int64_t evaluations = 0;
  result.status = "completed";
  // Several ranks: this rank's share of the shared order (positions stay global).
  std::optional<ShardedBatchSource> shard;
  if (data_ranks() > 1) shard.emplace(train, data_rank(), data_ranks());
  BatchSource& micro_batches = shard ? *shard : train;
  emit_memory();
  while (step < result.total_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const dist::Traffic traffic_before =
        distributed() ? options_.process.data_group->traffic() : dist::Traffic{};
    dist::ProcessGroup* tensor_group = options_.process.tensor_group;
    const dist::Traffic tensor_traffic_before =
        tensor_group ? tensor_group->traffic() : dist::Traffic{};
    dist::ProcessGroup* pipeline_group = options_.process.pipeline_group;
    const dist::Traffic pipeline_traffic_before =
        pipeline_group ? pipeline_group->traffic() : dist::Traffic{};
    double loss_sum = 0.0;      // this rank's loss: its micro-batches' by their targets
    double step_targets = 0.0;  // the targets of this rank's micro-batches
    std::int64_t tokens = 0;
    step_preference_ = {};
    // Where this step starts, to save it as it was if the device runs out of memory in it.
    const DataPosition step_start = train.position();
    const torch::Tensor cpu_rng = cpu_rng_state();
    const torch::Tensor device_rng =
        plugin_->device().is_cuda() ? device_rng_state(plugin_->device()) : torch::Tensor();
    try {
      // The step's micro-batches are read first. Each one's loss counts by its share of the
      // step's targets on every data-parallel rank (label tokens; rows for preference and
      // classification losses), as transformers' Trainer weights every token of a step alike
      // (num_items_in_batch across devices): splitting a step into micro-batches or ranks
      // (auto's plan, launch --nproc) then leaves its gradient as it was. Counted on the host
      // before the batches move: no wait for a device.
      std::vector<Batch> step_batches;
      std::vector<double> targets;
      for (std::int64_t micro = 0; micro < t.gradient_accumulation; ++micro) {
        step_batches.push_back(micro_batches.next());
        const Batch& batch = step_batches.back();
        tokens += batch.attention_mask.defined() ? batch.attention_mask.sum().item<std::int64_t>()
                                                 : batch.input_ids.numel();
        targets.push_back(loss_targets(batch));
      }
      double targets_here = 0.0;
      for (const double n : targets) targets_here += n;
      double targets_all = targets_here;
      if (data_ranks() > 1) {
        targets_all = 0.0;
        for (const double n : gather({targets_here}, /*data_only=*/true)) targets_all += n;
      }
      step_targets = targets_here;
      // A micro-batch's multiplier: its share of the step's targets, times the data-parallel
      // ranks whose gradients the strategy averages. Without targets (every label masked) the
      // micro-batches count alike, as before.
      const auto multiplier = [&](std::size_t micro) {
        return targets_all > 0.0 ? targets[micro] * static_cast<double>(data_ranks()) / targets_all
                                 : 1.0 / static_cast<double>(t.gradient_accumulation);
      };
      // This rank's loss: its micro-batches' weighted by their targets.
      const auto share_here = [&](std::size_t micro) {
        return targets_here > 0.0 ? targets[micro] / targets_here
                                  : 1.0 / static_cast<double>(t.gradient_accumulation);
      };
      std::vector<Plugin::MicroBatch> scheduled;  // for a plugin that runs them itself
      // The micro-batches' losses summed where they are computed and read once: on a GPU a read
      // per micro-batch would drain its queue between the backward and the next forward.
      torch::Tensor losses;
      for (std::size_t micro = 0; micro < step_batches.size(); ++micro) {
        const Batch& batch = step_batches[micro];
        // Micro-batch `micro` of this rank is micro-batch micro · ranks + rank of the step's
        // global order (ShardedBatchSource).
        const std::int64_t global_micro_batch =
            static_cast<std::int64_t>(micro) * data_ranks() + data_rank();
        const std::int64_t first_row = global_micro_batch * micro_batches.rows_per_batch();
        if (plugin_->runs_micro_batches()) {
          scheduled.push_back(
              {input_of(batch), dropout_stream(step, first_row), multiplier(micro)});
          continue;
        }
        const torch::Tensor loss =
            train_micro_batch(batch, multiplier(micro), micro + 1 == step_batches.size(), step,
                              first_row) *
            share_here(micro);
        losses = losses.defined() ? losses + loss : loss;
      }
      if (losses.defined()) loss_sum += losses.item<double>();
      if (!scheduled.empty()) {
        const std::vector<double> scheduled_losses = plugin_->run_micro_batches(scheduled);
        for (std::size_t micro = 0; micro < scheduled_losses.size(); ++micro)
          loss_sum += scheduled_losses[micro] * share_here(micro);
      }
    } catch (const DeviceOutOfMemory& e) {
      out_of_device_memory(e.what(), e.hint(), e.needed(), step, step_start, cpu_rng, device_rng,
                           train, result.total_steps);
    } catch (const c10::OutOfMemoryError& e) {
      const std::string what = e.what_without_backtrace();
      out_of_device_memory(
          plugin_->device().str() + ": out of memory: " + what.substr(0, what.find('\n')),
          "lower the batch size (keeping the effective batch with gradient accumulation), turn on "
          "activation checkpointing, train in bf16, or use strategy gemini",
          0, step, step_start, cpu_rng, device_rng, train, result.total_steps);
    }
    const double lr = schedule.lr(step);
    StepStats stats;
    try {
      stats = plugin_->step(lr, t.max_grad_norm);
    } catch (const DeviceOutOfMemory& e) {  // the update's workspace (moments made, staging)
      out_of_device_memory(e.what(), e.hint(), e.needed(), step, step_start, cpu_rng, device_rng,
                           train, result.total_steps, /*in_update=*/true);
    } catch (const c10::OutOfMemoryError& e) {
      const std::string what = e.what_without_backtrace();
      out_of_device_memory(
          plugin_->device().str() +
              ": out of memory in the update: " + what.substr(0, what.find('\n')),
          "lower the batch size (keeping the effective batch with gradient accumulation), train "
          "in bf16, offload the optimizer (zero's offload_optimizer), or use strategy gemini",
          0, step, step_start, cpu_rng, device_rng, train, result.total_steps, /*in_update=*/true);
    }
    ++step;
    if (step == result.total_steps) plugin_->settle();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double loss = loss_sum;
    double tokens_per_s = seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0;
    bool stop_requested = stop && stop->load();
    std::vector<RankStep> rank_steps;
    if (distributed()) {
      // Ranks that differ only in their tensor or pipeline coordinate read the same batches: the
      // job's tokens count each batch once.
      const double tokens_counted_here = static_cast<double>(tokens) * data_ranks() /
                                         static_cast<double>(options_.process.world_size);
      // One collective per step: the mean loss, the job's throughput, and a stop that every rank
      // makes at the same step (a signal may reach the ranks at different steps).
      // A plugin that runs the micro-batches itself (the same on every rank) adds its idle time.
      const bool scheduled = plugin_->runs_micro_batches();
      std::vector<double> mine{loss, tokens_counted_here, seconds, stop_requested ? 1.0 : 0.0};
      if (scheduled) mine.push_back(plugin_->last_schedule_idle_seconds());
      mine.push_back(step_targets);  // last: the weight of this rank's loss in the job's
      const std::size_t stride = mine.size();
      const std::vector<double> all = gather(mine);
      double loss_total = 0.0, targets_total = 0.0, tokens_total = 0.0, slowest = 0.0;
      for (std::size_t i = 0; i + stride <= all.size(); i += stride) {
        const int rank = static_cast<int>(i / stride);
        RankStep rank_step;
        rank_step.rank = rank;
        rank_step.loss = all[i];
        rank_step.targets = all[i + stride - 1];
        rank_step.tokens_per_s = all[i + 2] > 0 ? all[i + 1] / all[i + 2] : 0.0;
        if (scheduled) {
          rank_step.step_s = all[i + 2];
          rank_step.pipeline_idle_s = all[i + 4];
        }
        rank_steps.push_back(rank_step);
        // The job's loss weights each rank's by its targets, as the gradient does (ranks of
        // one replica hold the same figures, so they weigh alike).
        loss_total += all[i] * all[i + stride - 1];
        targets_total += all[i + stride - 1];
        tokens_total += all[i + 1];
        slowest = std::max(slowest, all[i + 2]);
        stop_requested = stop_requested || all[i + 3] != 0.0;
      }
      loss = targets_total > 0.0 ? loss_total / targets_total : loss;
      tokens_per_s = slowest > 0 ? tokens_total / slowest : 0.0;
      seconds = slowest;
    }
    // Every rank takes part (a collective), whether it reports or not.
    std::optional<PreferenceMetrics> preference;
    if (options_.method.preference) preference = preference_metrics(step_preference_);
    if (!std::isfinite(loss) || (!std::isfinite(stats.grad_norm) && stats.applied))
      throw_invalid("training diverged at step " + std::to_string(step) + ": loss " +
                        std::to_string(loss) + ", gradient norm " + std::to_string(stats.grad_norm),
                    "lower the learning rate, or use fp32");
    result.losses.push_back(loss);
    if (preference) result.preference.push_back(*preference);
    result.grad_norms.push_back(stats.grad_norm);
    result.lrs.push_back(lr);
    if (events_) events_->on_step_time(step, seconds);
    const bool first_of_run = !first_step_end;
    if (first_of_run) first_step_end = std::chrono::steady_clock::now();
    if (t.log_every <= 1 || step % t.log_every == 0 || step == result.total_steps) {
      if (events_) {
        std::optional<dist::Traffic> traffic;
        if (distributed()) traffic = options_.process.data_group->traffic() - traffic_before;
        std::optional<dist::Traffic> tensor_traffic;
        if (tensor_group) tensor_traffic = tensor_group->traffic() - tensor_traffic_before;
        std::optional<dist::Traffic> pipeline_traffic;
        if (pipeline_group) pipeline_traffic = pipeline_group->traffic() - pipeline_traffic_before;
        events_->on_step({step, loss, lr, stats.grad_norm, tokens_per_s, rank_steps, traffic,
                          tensor_traffic, pipeline_traffic, mesh_shape(), preference});
        const auto now = std::chrono::steady_clock::now();
        const std::int64_t after_first = step - result.start_step - 1;
        // A step's time leaves out the evaluations since the first step; the ones still to come
        // (every eval_every steps, and the last one) are added at their measured mean.
        const double per_step =
            first_of_run
                ? std::chrono::duration<double>(now - run_start).count()
                : std::max(0.0, std::chrono::duration<double>(now - *first_step_end).count() -
                                    evaluation_seconds) /
                      static_cast<double>(after_first);
        double eta = per_step * static_cast<double>(result.total_steps - step);
        if (eval) {
          std::int64_t left = 1;  // the last one
          if (t.eval_every > 0)   // at the steps after this one, before the last
            left += std::max<std::int64_t>(
                0, (result.total_steps - 1) / t.eval_every - step / t.eval_every);
          // Before one is timed: its batches' forwards, each the forward's share of a
          // micro-batch's step (a full fine-tune's backward computes two products per linear,
          // LoRA's frozen linears one; checkpointing runs the forward twice), as the plan counts.
          const double forward_share = 1.0 / (1.0 + (options_.method.type == "lora" ? 1.0 : 2.0) +
                                              (t.activation_checkpointing ? 1.0 : 0.0));
          const double rounds = std::ceil(static_cast<double>(eval->batches_per_epoch()) /
                                          static_cast<double>(std::max(1, data_ranks())));
          const double each = evaluations > 0
                                  ? evaluation_seconds / static_cast<double>(evaluations)
                                  : per_step / static_cast<double>(t.gradient_accumulation) *
                                        forward_share * rounds;
          eta += each * static_cast<double>(left);
        }
        events_->on_progress("train", step, result.total_steps, eta);
      }
      emit_memory();  // every rank: a collective when there are several
    }
    if (eval && t.eval_every > 0 && step % t.eval_every == 0 && step < result.total_steps) {
      const auto eval_start = std::chrono::steady_clock::now();
      EvalResult r = evaluate(*eval);
      evaluation_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
      ++evaluations;
      r.step = step;
      result.evals.push_back(r);
      emit_eval(r);
    }
    const bool stopping =
        stop_requested || (options_.stop_after_steps && step >= *options_.stop_after_steps);
    const bool periodic = t.save_every > 0 && step % t.save_every == 0;
    if (!options_.output_dir.empty() && (periodic || stopping || step == result.total_steps))
      result.last_checkpoint = save_checkpoint(step, train, result.total_steps);
    if (stopping && step < result.total_steps) {
      result.status = "stopped";
      break;
    }
  }
  result.steps_done = step;
  if (eval && result.status == "completed") {
    EvalResult r = evaluate(*eval);
    r.step = step;
    result.evals.push_back(r);
    emit_eval(r);
  }
  return result;
}

}  // namespace tessera::train
