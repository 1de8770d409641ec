// tessera-train-probe: runs the engine's trainer on a model folder and fixed token batches, for
// tests/parity/test_train_parity.py (comparison with transformers + torch.optim.AdamW and peft).
//
//   tessera-train-probe --model DIR --batches B.safetensors --steps N --report OUT.json
//       [--lr X] [--schedule constant|linear|cosine] [--warmup N] [--weight-decay X]
//       [--max-grad-norm X] [--grad-accum N] [--precision fp32|bf16] [--seed N]
//       [--method full|lora] [--lora-rank R] [--lora-alpha A] [--lora-targets a,b]
//       [--lora-init adapter_model.safetensors] [--out-dir DIR] [--save-every N]
//       [--keep-last K] [--resume DIR] [--stop-after N] [--events FILE]
//       [--final-weights W.safetensors] [--save-adapter DIR] [--logits L.safetensors]
//       [--threads N] [--lora-dropout P] [--activation-checkpointing] [--quantize nf4|fp4|int8]
//       [--double-quant] [--quantized-weights Q.safetensors]
//       [--preference dpo|ipo|simpo|orpo|kto] [--beta B] [--label-smoothing E] [--simpo-gamma G]
//       [--desirable-weight W] [--undesirable-weight W]
//       [--sft-weight W] [--reference-model DIR]
//       [--plugin NAME] [--strategy-options JSON]   (the device is "cpu" unless JSON names one)
//       [--profile TRACE.json --profile-from K]
//
// --profile records the steps after step K (K = 0: every step) with LibTorch's profiler (Kineto:
// the operators on the CPU, and on a GPU its kernels and copies) into a Chrome trace, for
// tests/gpu/trace_summary.py: where a step's time goes (tests/gpu/bench_gpu.py). Needs --events.
// With --preference every batch holds pairs: its chosen rows first, then the rejected ones; with
// kto, B also holds `desirable` [N, B/2] and each batch's second half is its mismatched rows.
// B holds `input_ids` [N, B, T] (I64) and optionally `attention_mask` and `labels` of the same
// shape: N batches, used in order. The report holds per-step losses, grad norms and lrs.
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/fatal_signals.h"
#include "job/events.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "plugins/builtin_plugins.h"
#include "runner/trainer_event_writer.h"
#include "train/lora.h"
#include "train/trainer.h"

namespace {

using namespace tessera;

[[noreturn]] void usage(const std::string& why) {
  throw Error(ErrorKind::Usage, why,
              "usage: tessera-train-probe --model DIR --batches B.safetensors --steps N "
              "--report OUT.json [options; see tests/tools/train_probe.cpp]");
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<train::Batch> read_batches(const std::string& path) {
  auto tensors = train::read_safetensors_tensors(path);
  if (!tensors.count("input_ids")) throw_invalid(path + ": no input_ids tensor");
  torch::Tensor ids = tensors.at("input_ids").to(torch::kInt64);
  if (ids.dim() != 3) throw_invalid(path + ": input_ids must be [N, B, T]");
  std::vector<train::Batch> batches;
  for (std::int64_t i = 0; i < ids.size(0); ++i) {
    train::Batch b;
    b.input_ids = ids[i].clone();
    b.attention_mask = tensors.count("attention_mask")
                           ? tensors.at("attention_mask").to(torch::kInt64)[i].clone()
                           : torch::ones_like(b.input_ids);
    b.labels = tensors.count("labels") ? tensors.at("labels").to(torch::kInt64)[i].clone()
                                       : b.input_ids.clone();
    if (tensors.count("desirable"))  // KTO: [N] per batch, then N mismatched rows
      b.desirable = tensors.at("desirable").to(torch::kBool)[i].clone();
    batches.push_back(b);
  }
  return batches;
}

// The process's peak resident set size (VmHWM), 0 when unavailable.
std::uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  return 0;
}

// The trainer's events, and the profiler started once step `from` has ended: the steps after it
// are recorded, up to finish().
class ProfilingEvents : public runner::TrainerEventWriter {
 public:
  ProfilingEvents(job::EventSink& sink, std::string trace, std::int64_t from, bool cuda)
      : TrainerEventWriter(sink), trace_(std::move(trace)), from_(from), cuda_(cuda) {
    if (!trace_.empty() && from_ == 0) start();
  }

  void on_step(const train::StepReport& report) override {
    TrainerEventWriter::on_step(report);
    if (!trace_.empty() && report.step == from_ && !active_) start();
  }

  // Ends the recording (kernels still queued on the GPU included) and writes the trace. A
  // profiler that fails is reported and costs the trace only, never the run's figures.
  void finish() {
    if (!active_) return;
    active_ = false;
    try {
      if (cuda_) torch::cuda::synchronize();
      namespace profiler = torch::autograd::profiler;
      std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
      result->save(trace_);
    } catch (const std::exception& e) {
      std::cerr << "tessera-train-probe: the profile was not written: " << e.what() << "\n";
    }
  }

 private:
  void start() {
    try {
      start_recording();
    } catch (const std::exception& e) {
      std::cerr << "tessera-train-probe: the profiler did not start: " << e.what() << "\n";
    }
  }

  void start_recording() {
    namespace profiler = torch::autograd::profiler;
    using torch::profiler::impl::ActivityType;
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                       /*report_input_shapes=*/false,
                                                       /*profile_memory=*/false);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda_) {
      torch::cuda::synchronize();  // the recording starts with the GPU idle, as the step does
      activities.insert(ActivityType::CUDA);
    }
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    active_ = true;
  }

  std::string trace_;
  std::int64_t from_ = 0;
  bool cuda_ = false;
  bool active_ = false;
};

train::PreferenceOptions& preference(train::TrainerOptions& options) {
  if (!options.method.preference) options.method.preference.emplace();
  return *options.method.preference;
}

int run(int argc, char** argv) {
  std::string model_dir, batches_path, report_path, events_path, final_weights, save_adapter,
      logits_path, quantized_weights_path, reference_dir, profile_path;
  std::int64_t profile_from = 0;
  train::TrainerOptions options;
  options.training.learning_rate = 1e-3;
  options.training.max_grad_norm = 1.0;
  options.training.schedule = "linear";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--model")
      model_dir = value();
    else if (arg == "--batches")
      batches_path = value();
    else if (arg == "--report")
      report_path = value();
    else if (arg == "--events")
      events_path = value();
    else if (arg == "--steps")
      options.training.steps = std::stoll(value());
    else if (arg == "--lr")
      options.training.learning_rate = std::stod(value());
    else if (arg == "--schedule")
      options.training.schedule = value();
    else if (arg == "--warmup")
      options.training.warmup_steps = std::stoll(value());
    else if (arg == "--weight-decay")
      options.training.weight_decay = std::stod(value());
    else if (arg == "--max-grad-norm")
      options.training.max_grad_norm = std::stod(value());
    else if (arg == "--grad-accum")
      options.training.gradient_accumulation = std::stoll(value());
    else if (arg == "--precision")
      options.precision = value();
    else if (arg == "--seed")
      options.training.seed = std::stoull(value());
    else if (arg == "--method")
      options.method.type = value();
    else if (arg == "--lora-rank")
      options.method.lora_rank = std::stoll(value());
    else if (arg == "--lora-alpha")
      options.method.lora_alpha = std::stod(value());
    else if (arg == "--lora-targets")
      options.method.lora_targets = split_commas(value());
    else if (arg == "--quantize")  // nf4 | fp4 | int8: LoRA on a quantized base
      options.method.quantize = value();
    else if (arg == "--double-quant")  // with a 4-bit --quantize: double-quantized absmax
      options.method.double_quant = true;
    else if (arg == "--quantized-weights")  // each quantized Linear's codes and scales
      quantized_weights_path = value();
    else if (arg == "--preference")  // dpo | ipo | simpo | orpo | kto
      preference(options).loss = train::preference_loss_from_name(value(), "--preference");
    else if (arg == "--desirable-weight")
      preference(options).desirable_weight = std::stod(value());
    else if (arg == "--undesirable-weight")
      preference(options).undesirable_weight = std::stod(value());
    else if (arg == "--beta")
      preference(options).beta = std::stod(value());
    else if (arg == "--label-smoothing")
      preference(options).label_smoothing = std::stod(value());
    else if (arg == "--simpo-gamma")
      preference(options).simpo_gamma = std::stod(value());
    else if (arg == "--sft-weight")
      preference(options).sft_weight = std::stod(value());
    else if (arg == "--reference-model")  // DPO / IPO: the reference (default: --model)
      reference_dir = value();
    else if (arg == "--lora-dropout")
      options.method.lora_dropout = std::stod(value());
    else if (arg == "--activation-checkpointing")
      options.training.activation_checkpointing = true;
    else if (arg == "--lora-init")
      options.lora_init = value();
    else if (arg == "--out-dir")
      options.output_dir = value();
    else if (arg == "--save-every")
      options.training.save_every = std::stoll(value());
    else if (arg == "--keep-last")
      options.training.keep_last = std::stoll(value());
    else if (arg == "--resume")
      options.resume = value();
    else if (arg == "--stop-after")
      options.stop_after_steps = std::stoll(value());
    else if (arg == "--final-weights")
      final_weights = value();
    else if (arg == "--save-adapter")
      save_adapter = value();
    else if (arg == "--logits")
      logits_path = value();
    else if (arg == "--plugin")  // a registered plugin (single, gemini)
      options.plugin = value();
    else if (arg == "--strategy-options")  // the plugin's options as a JSON object
      options.strategy_options = nlohmann::json::parse(value());
    else if (arg == "--profile")
      profile_path = value();
    else if (arg == "--profile-from")
      profile_from = std::stoll(value());
    else if (arg == "--threads")  // intra-op threads, for tests/bench/bench_train.py
      at::set_num_threads(static_cast<int>(std::stoll(value())));
    else
      usage("unknown argument \"" + arg + "\"");
  }
  if (model_dir.empty() || batches_path.empty() || report_path.empty() || !options.training.steps)
    usage("--model, --batches, --steps and --report are required");
  if (!profile_path.empty() && events_path.empty()) usage("--profile needs --events");
  if (!profile_path.empty() && (profile_from < 0 || profile_from >= *options.training.steps))
    usage("--profile-from must be at least 0 and below --steps");
  // The parity suites hold CPU tolerances: the probe computes on the CPU unless
  // --strategy-options names a device (tests/gpu names cuda), never where "auto" would put it.
  if (!options.strategy_options.is_object()) options.strategy_options = nlohmann::json::object();
  options.device = options.strategy_options.value("device", std::string("cpu"));
  options.base_model_name = model_dir;

  job::EventSink events;
  if (!events_path.empty()) events.open(events_path);
  ProfilingEvents trainer_events(events, profile_path, profile_from,
                                 options.device.rfind("cuda", 0) == 0);
  plugins::register_builtin_plugins();
  // As the runner does: the weights are read by the plugin (gemini: into its chunks) or loaded
  // by the trainer, so a model larger than memory starts under gemini.
  const hf::ModelConfig config =
      hf::load_model_config(std::filesystem::path(model_dir) / "config.json");
  auto model = model::create_model(config, model::head_from_config(config),
                                   torch::TensorOptions().dtype(torch::kFloat32));
  options.deferred_weights = std::make_shared<const model::DeferredWeights>(
      *model, hf::SafetensorsCheckpoint::open(model_dir));
  // Full fine-tuning with a reference objective: a frozen copy of the start (or the named model).
  const auto& preference_options = options.method.preference;
  if (preference_options && preference_options->needs_reference() &&
      (options.method.type == "full" || !reference_dir.empty())) {
    const std::string dir = reference_dir.empty() ? model_dir : reference_dir;
    const hf::ModelConfig reference_config =
        hf::load_model_config(std::filesystem::path(dir) / "config.json");
    options.reference_model =
        model::create_model(reference_config, model::head_from_config(reference_config),
                            torch::TensorOptions().dtype(torch::kFloat32));
    model::DeferredWeights(*options.reference_model, hf::SafetensorsCheckpoint::open(dir))
        .load_into(*options.reference_model);
  }
  std::vector<train::Batch> batches = read_batches(batches_path);
  train::FixedBatchSource source(batches, /*shuffle=*/false, options.training.seed);
  train::Trainer trainer(model, options, events_path.empty() ? nullptr : &trainer_events);
  options.deferred_weights.reset();
  train::TrainResult result = trainer.train(source);
  trainer_events.finish();

  nlohmann::json report = {{"losses", result.losses},
                           {"grad_norms", result.grad_norms},
                           {"lrs", result.lrs},
                           {"start_step", result.start_step},
                           {"steps_done", result.steps_done},
                           {"status", result.status}};
  if (!result.preference.empty()) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& m : result.preference) steps.push_back(runner::preference_json(m));
    report["preference"] = std::move(steps);
  }
  if (result.last_checkpoint) report["last_checkpoint"] = result.last_checkpoint->string();
  report["peak_rss_bytes"] = peak_rss_bytes();
  std::ofstream(report_path) << report.dump(2) << "\n";

  if (!final_weights.empty())
    train::write_safetensors_tensors(final_weights, trainer.plugin().trainable_weights());
  if (!save_adapter.empty()) {
    if (!trainer.lora()) usage("--save-adapter needs --method lora");
    auto weights = trainer.plugin().trainable_weights();
    trainer.lora()->save_adapter(save_adapter, model_dir, &weights);
  }
  if (!quantized_weights_path.empty()) {
    std::vector<optim::NamedTensor> stored;
    for (const auto& item : model->named_modules("", /*include_self=*/false))
      if (auto linear = std::dynamic_pointer_cast<model::LinearImpl>(item.value());
          linear && linear->quantized) {
        // int8 codes travel as their bytes (the writer has no I8).
        stored.push_back(
            {item.key() + ".weight.codes", linear->quantized->codes().view(torch::kUInt8)});
        const model::QuantizedWeight& q = *linear->quantized;
        if (q.nested()) {  // double-quantized absmax: their codes, block scales and offset
          stored.push_back({item.key() + ".weight.absmax_codes", q.nested()->codes});
          stored.push_back({item.key() + ".weight.absmax_scales", q.nested()->scales});
          stored.push_back({item.key() + ".weight.absmax_code", q.nested()->code});
          stored.push_back(
              {item.key() + ".weight.absmax_offset", torch::tensor({q.nested()->offset})});
        } else {
          stored.push_back({item.key() + ".weight.scales", q.scales()});
        }
      }
    train::write_safetensors_tensors(quantized_weights_path, std::move(stored),
                                     /*as_float32=*/false);
  }
  if (!logits_path.empty()) {
    torch::NoGradGuard no_grad;
    model->eval();
    if (trainer.lora()) trainer.lora()->refresh();
    model::ForwardInput in;  // on the device the plugin trained on (forward follows its input)
    in.input_ids = batches[0].input_ids.to(trainer.plugin().device());
    in.attention_mask = batches[0].attention_mask.to(trainer.plugin().device());
    torch::Tensor logits = model->forward(in).logits.to(torch::kCPU, torch::kFloat32).contiguous();
    train::write_safetensors_tensors(logits_path, {{"logits", logits}});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::core::report_fatal_signals("tessera-train-probe");
  try {
    return run(argc, argv);
  } catch (const tessera::Error& e) {
    std::cerr << "tessera-train-probe: " << e.what() << "\n";
    if (!e.hint().empty()) std::cerr << "hint: " << e.hint() << "\n";
    return e.kind() == tessera::ErrorKind::Io || e.kind() == tessera::ErrorKind::Internal ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "tessera-train-probe: " << e.what() << "\n";
    return 1;
  }
}
