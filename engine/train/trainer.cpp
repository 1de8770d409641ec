#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/files.h"
#include "core/meminfo.h"
#include "optim/schedule.h"
#include "train/activation_checkpoint.h"
#include "train/checkpoint.h"
#include "train/plugin_registry.h"

namespace tessera::train {
namespace fs = std::filesystem;

namespace {
constexpr const char* kTrainerState = "trainer_state.json";

}  // namespace

std::optional<std::uint64_t> system_memory_used_bytes() {
  const core::MemInfo m = core::read_meminfo();
  if (m.total == 0 || m.available > m.total) return std::nullopt;
  return m.total - m.available;
}

std::uint64_t process_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  return resident * static_cast<std::uint64_t>(page > 0 ? page : 4096);
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
  PluginOptions plugin_options;
  if (options_.deferred_weights) {
    if (plugin_->reads_deferred_weights())
      plugin_options.deferred_weights = options_.deferred_weights;
    else
      options_.deferred_weights->load_into(*model_);
    options_.deferred_weights.reset();  // the checkpoint's mapping closes after prepare()
  }
  plugin_options.precision = precision_from_name(options_.precision);
  plugin_options.device = options_.device;
  plugin_options.strategy_options = options_.strategy_options;
  plugin_options.run_dir = options_.output_dir;
  plugin_options.adamw = {t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay};
  plugin_->prepare(*model_, std::move(trainable), plugin_options);
  // Each layer's activations are recomputed in backward instead of kept (grad mode only; the
  // model bypasses the wrapper when it runs with a KV cache).
  if (t.activation_checkpointing) model_->layer_wrapper = &checkpointed;
  model_->train();
}

Trainer::~Trainer() {
  if (options_.training.activation_checkpointing) model_->layer_wrapper = nullptr;
}

std::int64_t Trainer::total_steps_for(const BatchSource& train) const {
  const TrainingOptions& t = options_.training;
  if (t.steps) return *t.steps;
  const std::int64_t per_epoch =
      std::max<std::int64_t>(1, train.batches_per_epoch() / t.gradient_accumulation);
  const double epochs = t.epochs ? *t.epochs : 1.0;
  const double steps = std::ceil(epochs * static_cast<double>(per_epoch));
  if (!(steps < 1e15)) throw_invalid("training.epochs: too many steps");
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(steps));
}

model::ForwardOutput Trainer::forward_batch(const Batch& batch) {
  model::ForwardInput in;
  const torch::Device device = plugin_->device();
  in.input_ids = batch.input_ids.to(device);
  in.attention_mask =
      batch.attention_mask.defined() ? batch.attention_mask.to(device) : torch::Tensor();
  in.labels = batch.labels.defined() ? batch.labels.to(device) : batch.input_ids.to(device);
  model::ForwardOutput out = model_->forward(in);
  if (!out.loss.defined())
    throw_invalid("training: the model computed no loss for a batch",
                  "the model needs a head with a loss (causal LM or classification)");
  return out;
}

double Trainer::train_micro_batch(const Batch& batch, bool last_micro_batch) {
  model::ForwardOutput out = forward_batch(batch);
  plugin_->backward(out.loss, 1.0 / static_cast<double>(options_.training.gradient_accumulation),
                    last_micro_batch);
  return out.loss.detach().to(torch::kFloat64).item<double>();
}

EvalResult Trainer::evaluate(BatchSource& source) {
  const DataPosition saved = source.position();
  source.seek({0, 0});
  model_->eval();
  double sum = 0.0;
  std::int64_t right = 0, labelled = 0;
  const bool classification = model_->head() == model::TaskHead::SequenceClassification;
  const std::int64_t n = source.batches_per_epoch();
  {
    torch::NoGradGuard no_grad;
    for (std::int64_t i = 0; i < n; ++i) {
      const Batch batch = source.next();
      model::ForwardOutput out = forward_batch(batch);
      sum += out.loss.detach().to(torch::kFloat64).item<double>();
      if (classification) {
        const torch::Tensor predicted = out.logits.argmax(-1).to(torch::kCPU);
        right += predicted.eq(batch.labels.to(torch::kCPU)).sum().item<std::int64_t>();
        labelled += batch.labels.size(0);
      }
    }
  }
  model_->train();
  source.seek(saved);
  EvalResult r;
  r.loss = sum / static_cast<double>(n);
  if (classification)
    r.accuracy = labelled > 0 ? static_cast<double>(right) / static_cast<double>(labelled) : 0.0;
  else
    r.perplexity = std::exp(r.loss);
  return r;
}

void Trainer::emit_eval(const EvalResult& r) {
  if (events_) events_->on_eval(r);
}

void Trainer::emit_memory() {
  if (!events_) return;
  const MemoryByCategory m = plugin_->memory();
  const std::uint64_t rss = process_rss_bytes();
  const std::uint64_t accounted = m.weights + m.gradients + m.optimizer;
  MemoryReport report;
  report.on_device = plugin_->device().is_cuda();
  report.device = plugin_->device().str();
  report.used = report.on_device ? accounted : rss;
  report.reserved = report.used;
  report.by_category = m;
  report.activations_other = rss > accounted ? rss - accounted : 0;
  // What the whole machine uses: other programs' memory pressure next to ours.
  if (!report.on_device) report.system_used = system_memory_used_bytes();
  events_->on_memory(report);
  if (const std::optional<DiskTierMemory> disk = plugin_->disk_memory()) {
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
    events_->on_memory(d);
  }
}

fs::path Trainer::save_checkpoint(std::int64_t step, const BatchSource& train,
                                  std::int64_t total_steps) {
  if (options_.output_dir.empty())
    throw_invalid("output.dir: required to save checkpoints", "give an output folder");
  if (events_) events_->on_progress("save", 0, 1, std::nullopt);
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
  };
  auto write = [&](const fs::path& dir) {
    std::vector<NamedTensor> weights = plugin_->trainable_weights();
    if (lora_)
      lora_->save_adapter(dir, options_.base_model_name, &weights);
    else
      write_safetensors_tensors(dir / "model.safetensors", std::move(weights), true,
                                {{"format", "pt"}});
    write_safetensors_tensors(dir / "optimizer.safetensors", plugin_->optimizer_state());
    write_safetensors_tensors(dir / "rng_state.safetensors", {{"torch_cpu", cpu_rng_state()}},
                              false);
    core::write_file_atomic(dir / kTrainerState, state.dump(2) + "\n");
  };
  fs::path path = write_checkpoint(options_.output_dir, step, write, {{"kind", "tessera-train"}});
  prune_checkpoints(options_.output_dir, options_.training.keep_last, path);
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
  FoundCheckpoint found = find_resume_checkpoint(*options_.resume, log);
  const std::string source = found.path.string();
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
    const fs::path weights_file =
        found.path / (lora_ ? "adapter_model.safetensors" : "model.safetensors");
    plugin_->load_state(read_safetensors_tensors(weights_file),
                        read_safetensors_tensors(found.path / "optimizer.safetensors"),
                        state.at("plugin_state"), source);
    auto rng = read_safetensors_tensors(found.path / "rng_state.safetensors");
    if (!rng.count("torch_cpu")) throw_invalid(source + ": rng_state.safetensors lacks torch_cpu");
    set_cpu_rng_state(rng.at("torch_cpu"));
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(source + "/" + kTrainerState + ": invalid (" + e.what() + ")");
  }
  if (events_)
    events_->on_log("info", "resumed from " + source + " at step " + std::to_string(found.step));
  return found.step;
}

TrainResult Trainer::train(BatchSource& train, BatchSource* eval, const std::atomic<bool>* stop) {
  const TrainingOptions& t = options_.training;
  TrainResult result;
  result.total_steps = total_steps_for(train);
  optim::LrSchedule schedule(optim::schedule_from_name(t.schedule), t.learning_rate, t.warmup_steps,
                             result.total_steps);
  std::int64_t step = options_.resume ? restore(train, result.total_steps) : 0;
  result.start_step = step;
  model_->train();
  const auto run_start = std::chrono::steady_clock::now();
  // The end of this run's first step: LibTorch's warm-up makes that step several times longer
  // than the others, so the ETA extrapolates from the steps after it (as the plan's calibration
  // does, plan/step_times.h).
  std::optional<std::chrono::steady_clock::time_point> first_step_end;
  result.status = "completed";
  emit_memory();
  while (step < result.total_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    std::int64_t tokens = 0;
    for (std::int64_t micro = 0; micro < t.gradient_accumulation; ++micro) {
      Batch batch = train.next();
      tokens += batch.attention_mask.defined() ? batch.attention_mask.sum().item<std::int64_t>()
                                               : batch.input_ids.numel();
      loss_sum += train_micro_batch(batch, micro + 1 == t.gradient_accumulation);
    }
    const double lr = schedule.lr(step);
    const StepStats stats = plugin_->step(lr, t.max_grad_norm);
    ++step;
    const double loss = loss_sum / static_cast<double>(t.gradient_accumulation);
    if (!std::isfinite(loss) || (!std::isfinite(stats.grad_norm) && stats.applied))
      throw_invalid("training diverged at step " + std::to_string(step) + ": loss " +
                        std::to_string(loss) + ", gradient norm " + std::to_string(stats.grad_norm),
                    "lower the learning rate, or use fp32");
    result.losses.push_back(loss);
    result.grad_norms.push_back(stats.grad_norm);
    result.lrs.push_back(lr);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (events_) events_->on_step_time(step, seconds);
    const bool first_of_run = !first_step_end;
    if (first_of_run) first_step_end = std::chrono::steady_clock::now();
    if (events_ && (t.log_every <= 1 || step % t.log_every == 0 || step == result.total_steps)) {
      events_->on_step({step, loss, lr, stats.grad_norm, seconds > 0 ? tokens / seconds : 0.0});
      const auto now = std::chrono::steady_clock::now();
      const std::int64_t after_first = step - result.start_step - 1;
      const double per_step = first_of_run
                                  ? std::chrono::duration<double>(now - run_start).count()
                                  : std::chrono::duration<double>(now - *first_step_end).count() /
                                        static_cast<double>(after_first);
      events_->on_progress("train", step, result.total_steps,
                           per_step * static_cast<double>(result.total_steps - step));
      emit_memory();
    }
    if (eval && t.eval_every > 0 && step % t.eval_every == 0 && step < result.total_steps) {
      EvalResult r = evaluate(*eval);
      r.step = step;
      result.evals.push_back(r);
      emit_eval(r);
    }
    const bool stopping =
        (stop && stop->load()) || (options_.stop_after_steps && step >= *options_.stop_after_steps);
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
