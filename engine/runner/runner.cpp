#include "runner/runner.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "core/temporaries.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/split.h"
#include "dist/parallel_context.h"
#include "export/export.h"
#include "export/merge_check.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/config.h"
#include "hf/families.h"
#include "hf/model_folder.h"
#include "hf/tokenizer/tokenizer.h"
#include "job/strategies.h"
#include "memory/disk_store.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "plan/model_size.h"
#include "plan/planner.h"
#include "plugins/builtin_plugins.h"
#include "runner/gpu_rates.h"
#include "runner/loopback_link.h"
#include "runner/trainer_event_writer.h"
#include "train/cpu_block_cache.h"
#include "train/example_batches.h"
#include "train/lora.h"
#include "train/plugin_registry.h"
#include "train/trainer.h"

namespace tessera::runner {
namespace {

namespace fs = std::filesystem;

std::int32_t pick_pad_id(const hf::Tokenizer& tokenizer, const hf::TokenizerConfig& config,
                         const hf::ModelConfig& model_config) {
  for (const auto& token : {config.pad_token, config.eos_token})
    if (token)
      if (auto id = tokenizer.token_to_id(*token)) return *id;
  if (model_config.pad_token_id) return static_cast<std::int32_t>(*model_config.pad_token_id);
  if (!model_config.eos_token_ids.empty())
    return static_cast<std::int32_t>(model_config.eos_token_ids.front());
  return 0;  // padding positions are masked out of attention and loss, so any id works
}

struct PreparedData {
  std::vector<data::TokenizedExample> train;
  std::vector<data::TokenizedExample> validation;
  bool classification = false;
  data::LabelSet labels;  // classification: id -> name
};

// The id2label of a config that already has a classification head (else none: the labels
// come from the data).
std::vector<std::string> head_labels(const hf::ModelConfig& config) {
  std::vector<std::string> names;
  bool has_head = std::any_of(config.architectures.begin(), config.architectures.end(),
                              [](const std::string& a) {
                                return a.find("ForSequenceClassification") != std::string::npos;
                              });
  if (!has_head) return names;
  for (const auto& [id, name] : config.id2label) {
    if (id != static_cast<std::int64_t>(names.size())) return {};
    names.push_back(name);
  }
  return names;
}

std::unique_ptr<data::DatasetReader> open_files(const std::vector<std::string>& files,
                                                bool skip_bad_rows) {
  data::ReadOptions options;
  options.skip_bad_rows = skip_bad_rows;
  return data::open_datasets({files.begin(), files.end()}, options);
}

// KTO: how many examples are desirable, and when the two kinds differ in number, whether the
// weights are in the range the KTO paper recommends (its Eq. 8: w_d·n_d / (w_u·n_u) in [1, 4/3]),
// with the range for either weight when they are not.
void log_kto_balance(const std::vector<data::TokenizedExample>& examples,
                     const job::PreferenceSpec& p, job::EventSink& events) {
  double desirable = 0.0;
  for (const auto& e : examples) desirable += e.desirable.value_or(false) ? 1.0 : 0.0;
  const double undesirable = static_cast<double>(examples.size()) - desirable;
  events.log("info", "kto: " + std::to_string(static_cast<std::int64_t>(desirable)) +
                         " desirable and " +
                         std::to_string(static_cast<std::int64_t>(undesirable)) +
                         " undesirable training examples");
  if (desirable == undesirable || desirable == 0.0 || undesirable == 0.0) return;
  const double ratio = p.desirable_weight * desirable / (p.undesirable_weight * undesirable);
  if (ratio >= 1.0 && ratio <= 4.0 / 3.0) return;
  const auto two = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", v);
    return std::string(text);
  };
  const double d_low = p.undesirable_weight * undesirable / desirable;
  const double u_high = p.desirable_weight * desirable / undesirable;
  events.log("warning",
             "kto: the weighted desirable and undesirable examples are out of the "
             "balance the KTO paper recommends (desirable_weight × " +
                 two(desirable) + " over undesirable_weight × " + two(undesirable) + " = " +
                 two(ratio) +
                 ", best between 1 and 1.33): set either "
                 "method.preference.desirable_weight in [" +
                 two(d_low) + ", " + two(d_low * 4.0 / 3.0) + "] or undesirable_weight in [" +
                 two(u_high * 3.0 / 4.0) + ", " + two(u_high) + "]");
}

PreparedData prepare_data(const job::JobSpec& spec, const hf::Tokenizer& tokenizer,
                          const hf::TokenizerConfig& tokenizer_config,
                          const hf::ModelConfig& model_config, job::EventSink& events) {
  const auto& ds = spec.dataset;
  events.progress("read", 0, 1);
  auto train_reader = open_files(ds.train_files, ds.skip_bad_rows);
  std::optional<data::FormatKind> kind;
  if (ds.format != "auto") kind = data::parse_format_kind(ds.format);
  data::DatasetFormat format = data::resolve_format(
      train_reader->columns(), train_reader->path().string(), kind, ds.columns);
  plan::check_packed_blocks_fit(spec, model_config,
                                ds.packing && format.kind == data::FormatKind::Text);
  const std::size_t more_files = ds.train_files.size() - 1;
  events.log(
      "info",
      "dataset " + train_reader->path().string() +
          (more_files > 0 ? " and " + std::to_string(more_files) + " more files" : std::string()) +
          ": " + std::to_string(train_reader->num_rows()) + " rows, format " + format.describe());
  // Rows that do not parse are left out before the split (skip_bad_rows); the rows that make no
  // example are counted per share below, so the log says where each skipped row was.
  if (!train_reader->skipped().summary().empty())
    events.log("warning", "unreadable rows: " + train_reader->skipped().summary());

  // Pairs train with a preference objective, and only pairs do.
  // Pairs train with a paired preference objective, KTO with unpaired examples, and only they do.
  const bool pairs = format.kind == data::FormatKind::Preference;
  const bool unpaired = format.kind == data::FormatKind::Unpaired;
  const auto& preference = spec.method.preference;
  if (preference && preference->loss == "kto" && !unpaired)
    throw_invalid(train_reader->path().string() +
                      ": method.preference.loss \"kto\" trains on unpaired examples (prompt, "
                      "completion, label), and the dataset's format is " +
                      format.describe(),
                  "choose a dataset with prompt, completion and label columns (dataset.format "
                  "\"unpaired\"), or a paired objective (dpo, ipo, simpo, orpo) for pairs");
  if (preference && preference->loss != "kto" && !pairs)
    throw_invalid(train_reader->path().string() + ": method.preference.loss \"" + preference->loss +
                      "\" trains on preference pairs, and the dataset's format is " +
                      format.describe(),
                  unpaired ? "use loss kto for unpaired examples"
                           : "choose a dataset with prompt, chosen and rejected columns "
                             "(dataset.format \"preference\", mapped with dataset.columns), or "
                             "remove method.preference");
  if ((pairs || unpaired) && !preference)
    throw_invalid(train_reader->path().string() + ": the dataset holds " +
                      (pairs ? "preference pairs (" : "unpaired preference examples (") +
                      format.describe() + "), and method.preference is not set",
                  pairs ? "set method.preference, e.g. {\"loss\": \"dpo\", \"beta\": 0.1}, to "
                          "align the model with the chosen completions"
                        : "set method.preference to {\"loss\": \"kto\"} to align the model with "
                          "the desirable completions");
  data::LabelSet labels;
  if (format.kind == data::FormatKind::Classification) {
    labels =
        data::derive_labels(*train_reader, format.columns.at("label"), head_labels(model_config));
    events.log("info", "labels: " + labels.describe());
  }

  data::TokenizeOptions options;
  options.max_length = static_cast<std::size_t>(ds.max_length);
  options.pack = ds.packing;
  data::ExampleBuilder builder(format, tokenizer, tokenizer_config, options, labels);

  PreparedData out;
  out.classification = format.kind == data::FormatKind::Classification;
  out.labels = labels;
  std::vector<std::size_t> train_rows;
  std::unique_ptr<data::DatasetReader> validation_reader;
  std::vector<std::size_t> validation_rows;
  if (!ds.validation_files.empty()) {
    validation_reader = open_files(ds.validation_files, ds.skip_bad_rows);
    // The training data's format reads the validation rows: their columns must be there.
    const std::vector<std::string>& columns = validation_reader->columns();
    if (const auto missing = data::first_missing_column(format, columns)) {
      const auto& [role, column] = *missing;
      std::string listed;
      for (const std::string& c : columns) listed += (listed.empty() ? "" : ", ") + c;
      throw_invalid(validation_reader->path().string() + ": the validation data has no column '" +
                        column + "' (" + role + "), which the training data's format " +
                        format.describe() + " reads; its columns: " + listed,
                    "give validation files with the training data's columns (dataset.validation), "
                    "or remove them and hold out training rows (dataset.validation_split)");
    }
    if (!validation_reader->skipped().summary().empty())
      events.log("warning",
                 "unreadable validation rows: " + validation_reader->skipped().summary());
    for (std::size_t i = 0; i < train_reader->num_rows(); ++i) train_rows.push_back(i);
    for (std::size_t i = 0; i < validation_reader->num_rows(); ++i) validation_rows.push_back(i);
  } else {
    data::SplitOptions split_options;
    if (ds.validation_split > 0) split_options.validation_fraction = ds.validation_split;
    split_options.shuffle = true;
    split_options.seed = spec.training.seed;
    data::Split split = data::split_rows(train_reader->num_rows(), split_options);
    train_rows = std::move(split.train);
    validation_rows = std::move(split.validation);
  }
  events.progress("read", 1, 1);

  auto total_rows = static_cast<std::int64_t>(train_rows.size() + validation_rows.size());
  events.progress("tokenize", 0, total_rows);
  auto train = data::tokenize_rows(*train_reader, train_rows, builder, ds.skip_bad_rows);
  events.progress("tokenize", static_cast<std::int64_t>(train_rows.size()), total_rows);
  if (!train.skipped.summary().empty())
    events.log("warning", "training rows: " + train.skipped.summary());
  if (train.dropped_tail_tokens > 0)
    events.log("info", "packing: the last " + std::to_string(train.dropped_tail_tokens) +
                           " tokens did not fill a block of " + std::to_string(ds.max_length) +
                           " and were left out");
  out.train = std::move(train.examples);
  if (unpaired && preference) log_kto_balance(out.train, *preference, events);
  if (!validation_rows.empty()) {
    const data::DatasetReader& reader = validation_reader ? *validation_reader : *train_reader;
    auto validation =
        data::tokenize_rows(reader, validation_rows, builder, ds.skip_bad_rows, "validation");
    if (!validation.skipped.summary().empty())
      events.log("warning", "validation rows: " + validation.skipped.summary());
    out.validation = std::move(validation.examples);
  }
  events.progress("tokenize", total_rows, total_rows);
  if (out.train.empty())
    throw_invalid(train_reader->path().string() + ": no training example left after tokenization",
                  ds.packing ? "the text is shorter than one block of dataset.max_length tokens; "
                               "lower max_length or set dataset.packing to false"
                             : "check the dataset's columns and format");
  return out;
}

// The expected LoRA delta of every adapted weight, in the weight's own layout, from the
// adapter tensors themselves (not from the merged weights), so the merge check is independent.
// Computed when asked for: the factors are small, a delta is as large as the weight it adapts,
// and holding all of them (in float64) would cost more than the model at export.
class LoraDeltas {
 public:
  LoraDeltas(const train::LoraModel& lora, const model::PretrainedModel& model)
      : scaling_(lora.scaling()), conv1d_(hf::family_of(model.config()).conv1d_weights) {
    std::map<std::string, torch::Tensor> a, b;
    const std::string prefix = "base_model.model.";
    for (const auto& [name, tensor] : lora.adapters()) {
      std::string module = name.substr(prefix.size());
      if (module.size() > 14 && module.ends_with(".lora_A.weight"))
        a[module.substr(0, module.size() - 14)] = tensor.detach().to(torch::kCPU, torch::kFloat64);
      else if (module.size() > 14 && module.ends_with(".lora_B.weight"))
        b[module.substr(0, module.size() - 14)] = tensor.detach().to(torch::kCPU, torch::kFloat64);
    }
    std::set<std::string> params;
    for (const auto& p : model.named_parameters()) params.insert(p.key());
    for (const auto& [module, lora_a] : a) {
      const std::string weight = module + ".weight";
      if (!params.count(weight))
        throw Error(ErrorKind::Internal, "LoRA module " + module + " has no weight");
      factors_[weight] = {b.at(module), lora_a};
    }
  }
  bool adapts(const std::string& weight) const { return factors_.count(weight) > 0; }
  // float64 on the CPU
  torch::Tensor of(const std::string& weight) const {
    const auto& [lora_b, lora_a] = factors_.at(weight);
    torch::Tensor delta = torch::matmul(lora_b, lora_a).mul_(scaling_);  // [out, in]
    // A Conv1D weight (GPT-2's) is stored [in, out] (PEFT's fan_in_fan_out).
    return conv1d_ ? delta.t().contiguous() : delta;
  }

 private:
  double scaling_;
  bool conv1d_;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> factors_;  // weight → (B, A)
};

// Adds `report`'s entries to `into`, `label` naming the stage in their problems.
void append_check(exporter::MergeCheckReport& into, exporter::MergeCheckReport report,
                  const std::string& label) {
  for (auto& e : report.entries) {
    if (!e.passed) e.problem = label + ": " + e.problem;
    into.entries.push_back(std::move(e));
  }
}

// A sequence classifier on `model_dir`: the checkpoint's weights, and a classification head
// (pooler and classifier when the checkpoint has none) initialised as transformers does, sized
// to the dataset's labels. The exported config names the labels.
std::shared_ptr<model::PretrainedModel> load_for_classification(const hf::ModelFolder& source,
                                                                const PreparedData& prepared,
                                                                const job::JobSpec& spec,
                                                                job::EventSink& events) {
  const fs::path& model_dir = source.dir();
  hf::ModelConfig config = source.config();
  auto classifies = [](const hf::FamilyTraits& f) { return f.sequence_classification; };
  if (!hf::family_of(config).sequence_classification)
    throw_unsupported(model_dir.string() + ": sequence classification is available for " +
                          hf::model_types_where(classifies) + " models only (" + config.model_type +
                          " has no classification head in this build)",
                      "use a " + hf::model_types_where(classifies) +
                          " model, or an instruction dataset that answers with the label");
  if (spec.method.type == "lora")
    throw_unsupported(
        "LoRA for sequence classification is not supported yet (the new "
        "classification head would stay untrained)",
        "use method full");
  std::vector<std::string> names = prepared.labels.names;
  if (names.empty()) {  // integer labels: 0 … max
    std::int64_t max_label = 1;
    for (const auto* set : {&prepared.train, &prepared.validation})
      for (const auto& ex : *set)
        if (ex.label) max_label = std::max(max_label, *ex.label);
    for (std::int64_t i = 0; i <= max_label; ++i) names.push_back("LABEL_" + std::to_string(i));
  }
  config.num_labels = static_cast<std::int64_t>(names.size());
  config.id2label.clear();
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (std::size_t i = 0; i < names.size(); ++i) {
    config.id2label[static_cast<std::int64_t>(i)] = names[i];
    id2label[std::to_string(i)] = names[i];
    label2id[names[i]] = i;
  }
  config.architectures = {"BertForSequenceClassification"};
  config.raw["architectures"] = config.architectures;
  config.raw["id2label"] = id2label;
  config.raw["label2id"] = label2id;
  auto model = model::create_model(config, model::TaskHead::SequenceClassification);
  model::init_weights(*model, spec.training.seed);
  model::LoadReport report =
      model::load_weights(*model, source.weights(), {"classifier.", "bert.pooler."});
  if (!report.initialized.empty()) {
    std::string list;
    for (const auto& n : report.initialized) list += (list.empty() ? "" : ", ") + n;
    events.log("info", "new classification head (" + std::to_string(names.size()) +
                           " labels), initialised: " + list);
  }
  return model;
}

// The trainer's options for `spec` (after planning: its strategy names a plugin).
train::TrainerOptions trainer_options(const job::JobSpec& spec, const fs::path& out_dir,
                                      const fs::path& model_dir) {
  train::TrainerOptions options;
  const job::TrainingSpec& t = spec.training;
  options.training.steps = t.steps;
  options.training.epochs = t.epochs;
  options.training.gradient_accumulation = t.gradient_accumulation;
  options.training.learning_rate = t.learning_rate;
  options.training.weight_decay = t.weight_decay;
  options.training.adam_beta1 = t.adam_beta1;
  options.training.adam_beta2 = t.adam_beta2;
  options.training.adam_eps = t.adam_eps;
  options.training.schedule = t.schedule;
  options.training.warmup_steps = t.warmup_steps;
  options.training.max_grad_norm = t.max_grad_norm;
  options.training.seed = t.seed;
  options.training.eval_every = t.eval_every;
  options.training.save_every = t.save_every;
  options.training.keep_last = t.keep_last;
  options.training.log_every = t.log_every;
  options.training.activation_checkpointing = t.activation_checkpointing;
  options.method.type = spec.method.type;
  options.method.lora_rank = spec.method.lora_rank;
  options.method.lora_alpha = spec.method.lora_alpha;
  options.method.lora_dropout = spec.method.lora_dropout;
  options.method.lora_targets = spec.method.lora_targets;
  if (spec.method.quantize != "none") options.method.quantize = spec.method.quantize;
  options.method.double_quant = spec.method.double_quant;
  if (const auto& p = spec.method.preference) {
    train::PreferenceOptions preference;
    preference.loss = train::preference_loss_from_name(p->loss, "method.preference.loss");
    preference.beta = p->beta;
    preference.label_smoothing = p->label_smoothing;
    preference.simpo_gamma = p->simpo_gamma;
    preference.sft_weight = p->sft_weight;
    preference.desirable_weight = p->desirable_weight;
    preference.undesirable_weight = p->undesirable_weight;
    options.method.preference = preference;
  }
  options.precision = spec.precision;
  options.plugin = spec.strategy.name;
  options.device = job::strategy_option(spec.strategy.name, spec.strategy.options, "device");
  options.strategy_options = spec.strategy.options;
  options.output_dir = out_dir;
  if (spec.output.resume) options.resume = fs::path(*spec.output.resume);
  options.base_model_name = fs::absolute(model_dir).string();
  return options;
}

// Several processes: rank 0's plan (as JSON) to every rank, or the reason it could not plan,
// which every rank then fails with (a rank must never wait for a plan that is not coming).
nlohmann::json share_plan(dist::ParallelContext& parallel, const nlohmann::json& plan_json) {
  const std::string text = plan_json.dump();
  at::Tensor size = at::full({1}, static_cast<std::int64_t>(text.size()), at::kLong);
  parallel.world().broadcast(size, 0);
  at::Tensor bytes = at::empty({size.item<std::int64_t>()}, at::kByte);
  if (parallel.rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  parallel.world().broadcast(bytes, 0);
  const nlohmann::json shared = nlohmann::json::parse(std::string(
      static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())));
  if (shared.contains("error"))
    throw Error(static_cast<ErrorKind>(shared["error"]["kind"].get<int>()),
                shared["error"]["message"].get<std::string>(),
                shared["error"]["hint"].get<std::string>());
  return shared;
}

// This machine as the planner sees it, for a run into `out_dir`. `measure_rates` false: the
// compute rates a cached profile has, nothing measured now (the step times go without them).
// `measure_disk` false: the disk's free space only, its speed neither measured nor read from the
// cache.
plan::HardwareProfile planning_hardware(const fs::path& out_dir, const RunOptions& run_options,
                                        const dist::ParallelContext* parallel,
                                        bool measure_rates = true, bool measure_disk = true) {
  // The run folder's disk too: `auto` may put optimizer state there (gemini). Its speed is
  // measured once a day and cached.
  plan::ProfileOptions profile_options;
  profile_options.disk_dir = out_dir;
  profile_options.measure_disk = measure_disk;
  // Several processes: the link between the ranks too (the loopback, measured once a day).
  if (parallel != nullptr) profile_options.measure_link = [] { return measure_loopback_link(); };
  // A GPU's copy and compute rates, for the step time (measured once a day).
  if (measure_rates)
    profile_options.measure_gpu = [](int index) { return measure_gpu_rates(index); };
  // The CPU's product rate, by a process that has every core (ranks of several share them:
  // they read what one process measured, when there is one).
  if (parallel == nullptr && measure_rates)
    profile_options.measure_cpu = [](int cores) { return measure_cpu_rate(cores); };
  plan::HardwareProfile hardware = plan::probe_hardware(profile_options);
  if (run_options.simulate_host_memory)
    hardware.memory.simulated = *run_options.simulate_host_memory;
  return hardware;
}

// What the planner takes for `spec` on `hardware`, every rank of `parallel` planned (if any).
// `count_rows` false: the data's rows are not counted (an epoch's steps go unknown).
plan::PlanInputs planning_inputs(const job::JobSpec& spec, const hf::ModelFolder& source,
                                 plan::HardwareProfile hardware,
                                 const dist::ParallelContext* parallel, bool count_rows = true) {
  plan::PlanInputs inputs = plan::plan_inputs(spec, source, std::move(hardware), count_rows);
  if (parallel != nullptr) {
    inputs.processes = parallel->world_size();
    inputs.processes_per_node = parallel->local_world_size();
  }
  return inputs;
}

// A named strategy trains the spec as written. Where the plan (on this machine's memory, or
// --simulate-host-memory's) finds that it does not fit as written, the run says so before it
// starts, naming what the planner would change, instead of training into an out-of-memory.
// Nothing is measured for it (the free disk is read, no rate is timed, the data's rows are not
// counted; a sample of them is tokenized, as the plan does). A job the planner refuses or has no
// cost model for gets no warning here: the run's own checks judge it.
std::optional<std::string> named_job_fit_warning(const job::JobSpec& spec,
                                                 const hf::ModelFolder& source,
                                                 const fs::path& out_dir,
                                                 const RunOptions& run_options,
                                                 const dist::ParallelContext* parallel) {
  plan::Plan planned;
  try {
    // The disk the strategy spills to (gemini's offload_dir), one process's view, nothing timed.
    plan::HardwareProfile hardware =
        planning_hardware(core::nearest_existing(plan::spill_dir_of(spec).value_or(out_dir)),
                          run_options, nullptr, /*measure_rates=*/false, /*measure_disk=*/false);
    planned = plan::make_plan(
        planning_inputs(spec, source, std::move(hardware), parallel, /*count_rows=*/false));
  } catch (const std::exception&) {  // advice only: whatever stops the plan leaves the run be
    return std::nullopt;
  }
  const bool simulated = !planned.tiers.empty() && planned.tiers.front().simulated;
  const std::string risk = "; strategy " + spec.strategy.name +
                           " trains it as written, so it may run out of memory" +
                           (simulated ? " (memory simulated by --simulate-host-memory)" : "");
  if (!planned.fits)
    return "by the plan's estimate this job does not fit: " + planned.what_would_fit + risk +
           " (tessera-cli plan shows the estimate)";
  // A checkpoint stored quantized is QLoRA's base as the user chose it (as auto's run says).
  const std::vector<std::string> changes = plan::applied_changes(
      plan::with_stored_quantization(spec, source.config()), planned.settings);
  if (changes.empty()) return std::nullopt;
  std::string listed;
  for (const std::string& change : changes) listed += (listed.empty() ? "" : "; ") + change;
  return "by the plan's estimate this job does not fit as written: the planner would train it "
         "with " +
         listed + risk + ": write those settings into the spec, or name strategy auto";
}

// Strategy "auto": the plan for this machine (or the one recorded when the run started, when
// it resumes), written to plan.json and announced as the `plan` event; returns the spec the
// run trains with. Other strategies: the spec as written. Several processes: rank 0 plans every
// rank (plan::PlanInputs::processes) and sends the plan to the others.
job::JobSpec plan_run(const job::JobSpec& spec, const hf::ModelFolder& source,
                      const fs::path& out_dir, const RunOptions& run_options,
                      job::EventSink& events, dist::ParallelContext* parallel) {
  if (spec.strategy.name != "auto") {
    // A host budget is checked before anything is loaded.
    if (spec.strategy.options.contains("host_budget"))
      if (const auto refusal =
              plan::check_host_budget(plan::plan_inputs(spec, source, plan::HardwareProfile{})))
        throw_invalid(refusal->message, refusal->hint);
    nlohmann::json reasons = {"strategy \"" + spec.strategy.name + "\" as the spec names it",
                              "precision " + spec.precision + ", method " + spec.method.type +
                                  ", batch " + std::to_string(spec.training.batch_size)};
    if (parallel == nullptr || parallel->rank() == 0)
      if (const auto warning =
              named_job_fit_warning(spec, source, out_dir, run_options, parallel)) {
        events.log("warning", *warning);
        reasons.push_back("warning: " + *warning);
      }
    events.emit("plan",
                {{"strategy", spec.strategy.name}, {"applied", false}, {"reasons", reasons}});
    return spec;
  }
  const fs::path recorded = out_dir / "plan.json";
  nlohmann::json plan_json;
  std::vector<std::string> reasons;
  // This process's plan: the one recorded when the run started, when it resumes, else a new one.
  auto plan_here = [&]() -> nlohmann::json {
    if (spec.output.resume && fs::exists(recorded)) {
      nlohmann::json doc;
      try {
        doc = nlohmann::json::parse(core::read_text_file(recorded));
      } catch (const nlohmann::json::exception& e) {
        throw_invalid(recorded.string() + ": not valid JSON (" + e.what() + ")",
                      "delete it to plan again from the job spec");
      }
      reasons.push_back("resumed: the settings planned when this run started (" +
                        recorded.string() + ")");
      return doc;
    }
    const plan::Plan planned = plan::make_plan(
        planning_inputs(spec, source, planning_hardware(out_dir, run_options, parallel), parallel));
    nlohmann::json doc = plan::to_json(planned);
    if (!planned.fits)
      throw_invalid(planned.explanation,
                    "use a smaller model or sequence length, or a machine with more memory");
    core::write_file_atomic(recorded, doc.dump(2) + "\n");
    return doc;
  };
  if (parallel == nullptr) {
    plan_json = plan_here();
  } else if (parallel->rank() != 0) {
    plan_json = share_plan(*parallel, nullptr);
  } else {
    // Rank 0 plans every rank; the others fail with its reason when it cannot.
    try {
      plan_json = plan_here();
    } catch (const Error& e) {
      share_plan(
          *parallel,
          {{"error",
            {{"kind", static_cast<int>(e.kind())}, {"message", e.what()}, {"hint", e.hint()}}}});
      throw;
    }
    share_plan(*parallel, plan_json);
  }
  if (!plan_json.contains("settings"))
    throw_invalid(recorded.string() + ": no settings", "delete it to plan again from the job spec");
  const plan::Settings settings =
      plan::settings_from_json(plan_json["settings"], recorded.string());
  // A checkpoint stored quantized is QLoRA's base as the user chose it: no change to report.
  const job::JobSpec chosen = plan::with_stored_quantization(spec, source.config());
  for (const auto& change : plan::applied_changes(chosen, settings))
    reasons.push_back("applied: " + change);
  // Never change what the user chose silently: a different method is a warning in the log too.
  if (settings.method != spec.method.type)
    events.log("warning", "the plan trains with " + settings.method + " instead of " +
                              spec.method.type + ": " + spec.method.type +
                              " fine-tuning does not fit on this machine (see the plan)");
  if (settings.method == "lora" && settings.quantize != chosen.method.quantize)
    events.log("warning", "the plan trains LoRA on a base quantized to " + settings.quantize +
                              " (QLoRA): LoRA on a dense base does not fit on this machine (see "
                              "the plan)");
  if (settings.precision != spec.precision)
    events.log("warning", "the plan trains in " + settings.precision + " instead of " +
                              spec.precision + " (see the plan for why)");
  if (settings.activation_checkpointing && !spec.training.activation_checkpointing)
    events.log("warning",
               "the plan turns activation checkpointing on (each layer's forward runs again in "
               "backward: more compute, less memory; see the plan for why)");
  if (settings.micro_batch != spec.training.batch_size)
    events.log("warning", "the plan trains micro-batches of " +
                              std::to_string(settings.micro_batch) + " with " +
                              std::to_string(settings.gradient_accumulation) +
                              " accumulation steps instead of batch_size " +
                              std::to_string(spec.training.batch_size) +
                              " (the same sequences per optimizer step; see the plan for why)");
  nlohmann::json all_reasons = plan_json.value("reasons", nlohmann::json::array());
  for (const auto& r : reasons) all_reasons.push_back(r);
  plan_json["reasons"] = all_reasons;
  plan_json["applied"] = true;
  events.emit("plan", plan_json);
  return plan::apply_settings(spec, settings);
}

// The spec's model folder, checked to be one.
fs::path model_dir_of(const job::JobSpec& spec) {
  if (spec.model.path.empty())
    throw_unsupported(
        "model.hub_id \"" + spec.model.hub_id + "\": downloading from the Hub is not supported yet",
        "download the model folder and give its path in model.path");
  const fs::path model_dir = spec.model.path;
  if (!fs::is_directory(model_dir))
    throw_invalid("model.path \"" + model_dir.string() + "\" is not a folder",
                  "give the folder of a HuggingFace model (config.json, *.safetensors, "
                  "tokenizer.json)");
  return model_dir;
}

// The model folder the run trains from, read once (config.json, the checkpoint's headers) and
// passed down to every stage.
hf::ModelFolder open_model(const fs::path& model_dir, const std::string& field = "model.path") {
  if (!fs::exists(model_dir / "config.json"))
    throw_invalid("job spec: " + field + " " + model_dir.string() + " has no config.json",
                  "point " + field + " at a HuggingFace model folder");
  return hf::ModelFolder::open(model_dir);
}

}  // namespace

void check_preference_reference(const job::JobSpec& spec, const fs::path& model_dir) {
  const auto& p = spec.method.preference;
  if (!p || p->reference.empty()) return;
  const hf::ModelFolder reference = open_model(p->reference, "method.preference.reference");
  if (!fs::exists(model_dir / "config.json")) return;
  const hf::ModelConfig model = hf::load_model_config(model_dir / "config.json");
  if (reference.config().vocab_size != model.vocab_size)
    throw_invalid("method.preference.reference: " + reference.dir().string() +
                      " has a vocabulary of " + std::to_string(reference.config().vocab_size) +
                      " tokens, the model " + std::to_string(model.vocab_size),
                  "name a reference with the trained model's tokenizer (its base, or an earlier "
                  "fine-tune of it)");
}

namespace {

// The dataset tokenized for the model, and the id that pads its batches.
struct TrainingData {
  PreparedData prepared;
  std::int32_t pad_id = 0;
};

TrainingData prepare_training_data(const job::JobSpec& spec, const hf::ModelFolder& source,
                                   job::EventSink& events) {
  const hf::Tokenizer tokenizer = hf::Tokenizer::from_folder(source.dir());
  const hf::TokenizerConfig tokenizer_config = hf::load_tokenizer_config_from_folder(source.dir());
  TrainingData data;
  data.prepared = prepare_data(spec, tokenizer, tokenizer_config, source.config(), events);
  data.pad_id = pick_pad_id(tokenizer, tokenizer_config, source.config());
  events.log("info", std::to_string(data.prepared.train.size()) + " training and " +
                         std::to_string(data.prepared.validation.size()) + " validation sequences");
  // Fewer sequences than a step asks for: a step cannot hold that many distinct ones (a batch is
  // cut where a pass over the data ends). Said, not silent.
  const std::int64_t per_step = spec.training.batch_size * spec.training.gradient_accumulation;
  if (const auto sequences = static_cast<std::int64_t>(data.prepared.train.size());
      sequences > 0 && sequences < per_step)
    events.log("warning", "the training data has " + std::to_string(sequences) +
                              " sequences, fewer than a step's " + std::to_string(per_step) +
                              " (training.batch_size × gradient_accumulation): no step has "
                              "that many distinct sequences, and each pass over the data ends "
                              "with a shorter micro-batch");
  return data;
}

// The model to train: a classifier with its new head loaded now, or a causal LM built without
// values whose weights the plugin reads from `weights` into its own storage (or the trainer
// loads), so a model larger than memory can start under gemini.
struct ModelToTrain {
  std::shared_ptr<model::PretrainedModel> model;
  std::shared_ptr<const model::DeferredWeights> weights;  // causal LMs
};

ModelToTrain load_model(const job::JobSpec& spec, const hf::ModelFolder& source,
                        const PreparedData& prepared, job::EventSink& events) {
  if (prepared.classification) return {load_for_classification(source, prepared, spec, events), {}};
  const hf::ModelConfig& config = source.config();
  if (model::head_from_config(config) != model::TaskHead::CausalLM) {
    auto causal = [](const hf::FamilyTraits& f) { return f.causal_lm; };
    auto classifies = [](const hf::FamilyTraits& f) { return f.sequence_classification; };
    throw_unsupported(source.dir().string() + ": " + config.model_type +
                          " is not a causal language model, and only classification datasets "
                          "train other heads",
                      "choose a " + hf::model_types_where(causal) +
                          " model, or a classification dataset (text, label) for a " +
                          hf::model_types_where(classifies) + " model");
  }
  ModelToTrain out;
  out.model = model::create_model(config, model::TaskHead::CausalLM,
                                  torch::TensorOptions().dtype(torch::kFloat32));
  out.model->eval();
  out.weights = std::make_shared<const model::DeferredWeights>(*out.model, source.weights());
  return out;
}

// DPO and IPO compare with a frozen reference: the named one, or with full fine-tuning a copy of
// the model as it starts (LoRA without a named one compares with its base, adapters off: none
// here). Read straight into the compute dtype (the trainer places it on the device): the load
// never holds it in float32.
std::shared_ptr<model::PretrainedModel> load_reference_model(const job::JobSpec& spec,
                                                             const hf::ModelFolder& source,
                                                             job::EventSink& events) {
  const auto& p = spec.method.preference;
  if (!p || (p->loss != "dpo" && p->loss != "ipo" && p->loss != "kto")) return nullptr;
  if (p->reference.empty() && spec.method.type != "full") return nullptr;
  const hf::ModelFolder reference =
      p->reference.empty() ? source : open_model(p->reference, "method.preference.reference");
  const hf::ModelConfig& config = reference.config();
  auto model = model::create_model(config, model::TaskHead::CausalLM,
                                   torch::TensorOptions().dtype(torch::kFloat32));
  model::DeferredWeights(*model, reference.weights())
      .load_into(*model, train::compute_dtype_of(train::precision_from_name(spec.precision)));
  events.log("info", "preference reference: " + reference.dir().string() +
                         (p->reference.empty() ? " as it starts" : "") +
                         ", a frozen copy beside the model");
  return model;
}

train::TrainResult train_model(train::Trainer& trainer, const job::JobSpec& spec, TrainingData data,
                               const std::atomic<bool>* stop) {
  const auto max_length = static_cast<std::size_t>(spec.dataset.max_length);
  train::ExampleBatchSource train_source(std::move(data.prepared.train), spec.training.batch_size,
                                         /*shuffle=*/true, spec.training.seed, data.pad_id,
                                         max_length);
  std::optional<train::ExampleBatchSource> eval_source;
  if (!data.prepared.validation.empty())
    eval_source.emplace(std::move(data.prepared.validation), spec.training.batch_size,
                        /*shuffle=*/false, spec.training.seed, data.pad_id, max_length);
  return trainer.train(train_source, eval_source ? &*eval_source : nullptr, stop);
}

exporter::ExportOptions export_options_for(const hf::ModelFolder& source, job::EventSink& events) {
  exporter::ExportOptions options;
  options.tokenizer_dir = source.dir();
  options.source_dir = source.dir();
  options.force = true;  // the run folder is ours; a rerun of the same job replaces it
  options.progress = [&events, stage = 0](const std::string& what) mutable {
    events.log("info", "export: " + what);
    events.progress("export", ++stage, 0);
  };
  return options;
}

// LoRA: the adapter in PEFT format to out_dir/adapter, and the model with the adapter merged to
// out_dir/model. Returns the adapter folder.
//
// The merged model is streamed one weight at a time (exporter::export_streamed), so the export
// holds one weight's copies beside the training model, never a second model: each base weight in
// float32 — a quantized one (QLoRA) dequantized from the training model, the base the adapter
// trained on; any other read from the checkpoint, so a base rounded for training in a lower
// precision loses nothing — plus the adapter's delta where it adapts one. Each merged weight is
// checked against a copy of its base and the delta computed from the adapter's factors before it
// is written; the written files are then read back and compared byte for byte with the merged
// weights computed again.
fs::path export_merged_lora(const hf::ModelFolder& source, train::Trainer& trainer,
                            model::PretrainedModel& model, const model::DeferredWeights& checkpoint,
                            std::int64_t step, const fs::path& out_dir, job::EventSink& events) {
  train::LoraModel& lora = *trainer.lora();
  trainer.plugin().gather_weights();  // the adapters whole and in memory
  const fs::path adapter_dir = out_dir / "adapter";
  fs::create_directories(adapter_dir);
  lora.save_adapter(adapter_dir, fs::absolute(source.dir()).string());
  events.emit("checkpoint", {{"step", step}, {"path", adapter_dir.string()}, {"kind", "adapter"}});
  const LoraDeltas deltas(lora, model);
  const auto quantized = model::quantized_weights(model);
  exporter::MergeCheckReport merge_check;
  bool first_pass = true;
  const exporter::WeightSource merged = [&](const auto& visit) {
    torch::NoGradGuard no_grad;
    for (const auto& [name, shape] : model::dense_parameter_shapes(model)) {
      torch::Tensor weight;
      if (const auto q = quantized.find(name); q != quantized.end()) {
        weight = q->second->dequantize_to_host();  // merged on the host, QLoRA on a GPU too
      } else {
        weight = torch::empty(shape, torch::kFloat32);
        checkpoint.read_into(name, weight);
      }
      if (deltas.adapts(name)) {
        const torch::Tensor delta = deltas.of(name);
        const torch::Tensor base = first_pass ? weight.clone() : torch::Tensor();
        weight.add_(delta.to(torch::kFloat32));
        if (first_pass) {
          // A failure stops the export before anything is renamed into place.
          append_check(
              merge_check,
              exporter::check_merged_deltas({{name, base}}, {{name, weight}}, {{name, delta}}),
              "merged");
          if (merge_check.failures() > 0)
            throw Error(ErrorKind::Internal,
                        "merged export failed its check: " + merge_check.summary(),
                        "the adapter in " + adapter_dir.string() + " is intact");
        }
      }
      visit(name, weight);
    }
    first_pass = false;
  };
  exporter::export_streamed(model, merged, out_dir / "model", export_options_for(source, events));
  events.log("info", "merged export verified: " + std::to_string(merge_check.entries.size()) +
                         " adapted weight(s) equal base + delta, and every tensor read back "
                         "from the written files equals the merged weight");
  return adapter_dir;
}

// Full fine-tuning: the trained weights to out_dir/model, streamed from the plugin's storage
// when they are not all in memory.
void export_trained(const hf::ModelFolder& source, train::Plugin& plugin,
                    model::PretrainedModel& model, const fs::path& out_dir,
                    job::EventSink& events) {
  if (!plugin.weights_in_memory())
    exporter::export_streamed(
        model, [&](const auto& visit) { plugin.visit_weights(model, visit); }, out_dir / "model",
        export_options_for(source, events));
  else
    exporter::export_pretrained(model, out_dir / "model", export_options_for(source, events));
}

// The registered plugins that run on several processes, "a, b" (or "none in this build").
std::string distributed_strategies() {
  std::string names;
  for (const auto& name : train::registered_plugins())
    if (train::make_plugin(name)->runs_distributed()) names += (names.empty() ? "" : ", ") + name;
  return names.empty() ? "none in this build" : names;
}

}  // namespace

void check_processes(const job::JobSpec& spec, int world_size) {
  // Preference tuning or QLoRA under a strategy that does not take it: refused before any rank
  // starts (each rank's trainer would say the same once its data had loaded).
  if (spec.method.preference && spec.strategy.name != job::kAutoStrategy &&
      !job::strategy_can(spec.strategy.name, &job::StrategyInfo::preference))
    throw_unsupported("preference tuning (method.preference) under strategy \"" +
                          spec.strategy.name + "\" is not supported yet",
                      "use strategy " + job::strategies_that_can(&job::StrategyInfo::preference));
  if (spec.method.quantize != "none" && spec.strategy.name != job::kAutoStrategy &&
      !job::strategy_can(spec.strategy.name, &job::StrategyInfo::quantized_base))
    throw_unsupported(
        "QLoRA (method.quantize \"" + spec.method.quantize + "\") under strategy \"" +
            spec.strategy.name + "\" is not supported yet",
        "use strategy " + job::strategies_that_can(&job::StrategyInfo::quantized_base));
  if (spec.strategy.name == "hybrid") check_hybrid(spec, world_size);
  if (world_size <= 1) return;
  plugins::register_builtin_plugins();
  const std::string processes = std::to_string(world_size) + " processes";
  // auto: the planner chooses among the strategies that distribute (plan::make_plan).
  if (spec.strategy.name == job::kAutoStrategy) return;
  if (!train::make_plugin(spec.strategy.name)->runs_distributed())
    throw_unsupported("strategy \"" + spec.strategy.name +
                          "\" runs in one process and does not distribute: it cannot run as " +
                          processes,
                      "set strategy.name to one that distributes (" + distributed_strategies() +
                          "), or run one process (tessera-cli run)");
}

void check_hybrid(const job::JobSpec& spec, int world_size) {
  // The model's sizes, when its folder is here (a Hub model is judged once downloaded).
  std::optional<hf::ModelConfig> config;
  if (!spec.model.path.empty()) {
    const fs::path config_file = fs::path(spec.model.path) / "config.json";
    if (fs::is_regular_file(config_file)) config = hf::load_model_config(config_file);
  }
  plan::check_hybrid(spec, world_size, config ? &*config : nullptr);
}

namespace {

// Several processes (WORLD_SIZE above 1): joins the job's other ranks (engine/dist); one
// process: null. Refuses what cannot run on several processes before anyone waits on a peer.
std::shared_ptr<dist::ParallelContext> join_ranks(const job::JobSpec& spec) {
  const dist::DistEnvironment environment = dist::read_dist_environment();
  check_processes(spec, environment.world_size);
  if (!environment.is_distributed()) return nullptr;
  // NCCL groups only for a job that computes on CUDA (ddp or zero with device "cuda", or "auto"
  // with a GPU for each rank of this machine: the plugins decide by the same job::device_for);
  // the others compute on the CPU, so Gloo carries every collective and NCCL groups would only
  // hold GPU memory on each rank. `auto` is planned first; its plan names the device.
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const bool on_cuda =
      spec.strategy.name != job::kAutoStrategy && gpus > 0 &&
      job::device_for(spec.strategy.name,
                      job::strategy_option(spec.strategy.name, spec.strategy.options, "device"),
                      environment.world_size, environment.local_world_size, gpus)
              .device == "cuda";
  // Ranks that share a GPU (tests only): NCCL refuses them; their collectives on CUDA tensors go
  // through host memory over Gloo.
  const bool share_gpu = on_cuda && job::tests_share_gpu() && environment.local_world_size > gpus;
  return dist::ParallelContext::from_environment(/*cuda_collectives=*/on_cuda && !share_gpu,
                                                 /*cuda_through_host=*/share_gpu);
}

}  // namespace

RunOutcome run_job(const job::JobSpec& requested, job::EventSink& events,
                   const RunOptions& run_options) {
  const fs::path model_dir = model_dir_of(requested);
  // Checked again here: a spec built in code has not been through parse_job_spec.
  job::validate_strategy(requested.strategy.name, requested.strategy.options, "job spec");
  plugins::register_builtin_plugins();
  const std::shared_ptr<dist::ParallelContext> parallel = join_ranks(requested);
  // Rank 0 alone writes the run folder's files (job.json, plan.json, the export); the event
  // stream is rank 0's too (the caller opens it there only).
  const bool leader = !parallel || parallel->rank() == 0;
  if (leader && parallel && parallel->options().cuda_through_host)
    events.log("warning",
               "the ranks share GPUs (TESSERA_TESTS_SHARE_GPU, tests only): collectives on the GPU "
               "go through host memory over Gloo");
  if (leader && parallel && parallel->options().copy_every_tensor)
    events.log("warning",
               "every collective runs on a copy of its tensor (TESSERA_DIST_COPY_EVERY_TENSOR, "
               "tests only)");
  const fs::path out_dir = requested.output.dir;
  core::create_output_folder(out_dir, "--out (output.dir in the job spec)");
  // A run, resume or export of this folder killed earlier (kill -9, power loss) left temporary
  // files and folders: those of processes that are gone are removed, a live one's kept.
  if (leader)
    core::remove_dead_temporaries(out_dir,
                                  [&](const std::string& line) { events.log("info", line); });
  const hf::ModelFolder source = open_model(model_dir);
  check_preference_reference(requested, model_dir);
  plan::check_quantizable(requested, source.config());
  // What config.json asks for is judged before anything of the model is built (a model of 1e9
  // layers would be allocated until the process is killed): refused by its field.
  plan::ModelCapacity capacity = plan::probe_model_capacity(plan::spill_dir_of(requested));
  if (run_options.simulate_host_memory)
    capacity.memory.simulated = *run_options.simulate_host_memory;
  plan::check_training_fits(source.config(), (model_dir / "config.json").string(), requested,
                            parallel ? parallel->world_size() : 1, capacity);
  // Sequences allowed longer than the positions the model was trained for: learned position
  // embeddings end there (a longer sequence is refused at its forward), rotary ones reach past
  // it untrained. Said once, before anything loads.
  if (const std::int64_t positions = source.config().max_position_embeddings;
      leader && positions > 0 && requested.dataset.max_length > positions)
    events.log("warning",
               "dataset.max_length " + std::to_string(requested.dataset.max_length) +
                   " exceeds the model's max_position_embeddings " + std::to_string(positions) +
                   (hf::family_of(source.config()).learned_positions
                        ? ": its learned position embeddings end there, so a longer sequence "
                          "stops the run; set dataset.max_length to " +
                              std::to_string(positions) + " at most"
                        : ": positions past it were never trained (rotary embeddings reach "
                          "them, but the model has not learned them)"));
  // Planned before the data and the weights are read, so a job that cannot fit fails in a
  // second.
  const job::JobSpec spec =
      plan_run(requested, source, out_dir, run_options, events, parallel.get());
  // Freed buffers of a few MiB go back at once instead of staying in glibc's heap, and LibTorch's
  // large blocks come from a cache of at most kCpuBlockCacheBytes (train/cpu_block_cache.h), so
  // that a step reuses its blocks without page-faulting them anew. A host budget the user set is
  // what this process may hold resident (the disk tier's host floor): then nothing is kept.
  // Without one, the peak the plan is held to would otherwise depend on how the heap happened to
  // be reused: hybrid tp2's ranks peaked anywhere in 597-775 MiB over five identical runs with
  // glibc's sliding mmap threshold, 552-583 MiB with it fixed.
  const auto budget = requested.strategy.options.find("host_budget");
  const bool budgeted = budget != requested.strategy.options.end() && *budget != "auto";
  memory::bound_heap_retention();
  train::install_cpu_block_cache(budgeted ? 0 : train::kCpuBlockCacheBytes);

  events.progress("load", 0, 1);
  TrainingData data = prepare_training_data(spec, source, events);
  ModelToTrain to_train = load_model(spec, source, data.prepared, events);
  events.progress("load", 1, 1);

  train::TrainerOptions options = trainer_options(spec, out_dir, source.dir());
  options.deferred_weights = std::move(to_train.weights);
  options.reference_model = load_reference_model(spec, source, events);
  // hybrid: a dp × pp × tp mesh, tp innermost so that a tensor group's ranks are neighbours
  // (one machine's, when launched per node), then the pipeline's stages; the data group is the
  // outer dimension.
  std::shared_ptr<dist::ProcessGroup> data_group, tensor_group, pipeline_group;
  if (parallel) {
    options.process = {parallel->rank(), parallel->world_size(), parallel, &parallel->world()};
    if (spec.strategy.name == "hybrid") {
      const int world = parallel->world_size();
      const int tp = job::hybrid_tensor_parallel_size(spec.strategy.options);
      const int pp = job::hybrid_pipeline_parallel_size(spec.strategy.options);
      // (check_processes refused sizes that do not divide the world before joining.)
      const std::vector<int> mesh{world / (tp * pp), pp, tp};
      data_group = parallel->new_mesh_group(mesh, 0);
      tensor_group = parallel->new_mesh_group(mesh, 2);
      if (pp > 1) pipeline_group = parallel->new_mesh_group(mesh, 1);
      options.process.data_group = data_group.get();
      options.process.tensor_group = tensor_group.get();
      options.process.pipeline_group = pipeline_group.get();
    }
  }
  TrainerEventWriter trainer_events(events);
  // This machine's step time for the job as planned, for later plans (plan/step_times.h). Of
  // several processes, rank 0 records the step (the slowest rank's, every rank knows it) under
  // their number: a plan of the same job with as many processes takes it whole.
  std::optional<StepTimeRecorder> step_times;
  if (!parallel || parallel->rank() == 0) {
    step_times.emplace(
        plan::StepTimeStore(plan::StepTimeStore::default_path()),
        plan::step_time_key(spec, source.config(), plan::probe_hardware(plan::ProfileOptions{}),
                            parallel ? parallel->world_size() : 1,
                            parallel ? parallel->local_world_size() : 1),
        fs::absolute(out_dir).string(), events);
    trainer_events.record_step_times(&*step_times);
  }
  // The job the folder's run now follows, written once its model and data have loaded: a job
  // refused on the way (bad data, a model that cannot load) leaves the folder's job.json as it
  // was, so the run that is there still resumes as it was.
  if (leader) job::save_job_spec(requested, out_dir / "job.json");
  train::Trainer trainer(to_train.model, options, &trainer_events);
  // Read by now: the checkpoint's pages can go. LoRA's merged export reads the base again, one
  // weight at a time.
  const std::shared_ptr<const model::DeferredWeights> checkpoint_weights =
      spec.method.type == "lora" ? options.deferred_weights : nullptr;
  options.deferred_weights.reset();
  source.release_resident_pages();
  // While the steps run, a stop request ends the step with a checkpoint (the caller's signal
  // handler only sets `stop`); before and after, it ends the process at once.
  struct StepEndWindow {
    std::atomic<bool>* flag = nullptr;
    explicit StepEndWindow(std::atomic<bool>* f) : flag(f) {
      if (flag) flag->store(true);
    }
    ~StepEndWindow() {
      if (flag) flag->store(false);
    }
  };
  train::TrainResult result;
  {
    const StepEndWindow step_end_window(run_options.stopping_at_step_end);
    try {
      result = train_model(trainer, spec, std::move(data), run_options.stop);
    } catch (const train::StepOutOfDeviceMemory& e) {
      // The plan's smallest change that fits, planned for a device as much smaller as the run
      // needed more than the plan estimated (several processes: this rank's device, the job
      // planned for every rank). The device is full: nothing is measured on it now, nor the
      // link between the ranks, whose peers may be waiting in a collective.
      std::string hint;
      try {
        hint = plan::change_after_device_shortfall(
            planning_inputs(spec, source, planning_hardware(out_dir, run_options, nullptr, false),
                            parallel.get()),
            e.needed());
      } catch (const std::exception& planning) {
        hint = e.hint() + " (planning a change failed: " + planning.what() + ")";
      }
      throw Error(ErrorKind::OutOfMemory, e.what(), hint.empty() ? e.hint() : hint);
    }
  }
  if (step_times) step_times->finish();
  // A plugin that shards the weights (gemini on several ranks) gathers them with every rank, so
  // that rank 0 alone can export them; then every rank is done with collectives, the other ranks
  // leave, rank 0 exports.
  if (parallel && result.status == "completed") trainer.plugin().gather_weights();
  // NCCL's waits only order the streams: a rank's last collectives may still be running on its
  // GPU, and a rank that leaves past the barrier ends its communicators under them.
  if (parallel && trainer.plugin().device().is_cuda())
    torch::cuda::synchronize(trainer.plugin().device().index());
  if (parallel) parallel->world().barrier();

  RunOutcome outcome;
  outcome.status = result.status;
  outcome.steps_done = result.steps_done;
  outcome.total_steps = result.total_steps;
  outcome.last_checkpoint = result.last_checkpoint;
  if (!result.losses.empty()) outcome.final_loss = result.losses.back();
  if (!result.evals.empty()) outcome.final_eval_loss = result.evals.back().loss;
  if (result.status != "completed" || !leader) return outcome;
  // The optimizer is done: its memory goes to the export.
  trainer.plugin().release_training_state();
  if (trainer.lora()) {
    if (!checkpoint_weights)
      throw Error(ErrorKind::Internal,
                  "LoRA trained without the checkpoint's weights to merge into");
    outcome.adapter_dir = export_merged_lora(source, trainer, *to_train.model, *checkpoint_weights,
                                             result.steps_done, out_dir, events);
  } else
    export_trained(source, trainer.plugin(), *to_train.model, out_dir, events);
  outcome.model_dir = out_dir / "model";
  events.emit(
      "checkpoint",
      {{"step", result.steps_done}, {"path", (out_dir / "model").string()}, {"kind", "model"}});
  return outcome;
}

}  // namespace tessera::runner
