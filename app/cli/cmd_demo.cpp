// tessera-cli demo: the embedded default, offline. Builds a small Llama-architecture model and a
// byte-level tokenizer, generates a string-transformation dataset, fine-tunes, measures held-out
// accuracy by greedy generation before and after, exports, and prints sample generations.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "data/format.h"
#include "export/export.h"
#include "hf/chat/tokenizer_config.h"
#include "hf/tokenizer/tokenizer.h"
#include "job/job_spec.h"
#include "model/generate.h"
#include "model/model.h"
#include "run_job.h"
#include "runner/demo.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

// The default run, chosen by measurement (README.md states what it reaches and how long it takes).
// Learning rate 2e-3 with a warm-up of a tenth of the steps: at 3e-3 with 20 warm-up steps some
// seeds stalled with "upper" half learned; 20000 training words rather than 4000, so that a
// thousand steps of 64 rows see each word about three times, not sixteen.
constexpr std::int64_t kDefaultSteps = 1000;
constexpr std::int64_t kBatchSize = 64;
constexpr double kLearningRate = 2e-3;
constexpr std::size_t kTrainingRows = 20000;
constexpr std::size_t kHeldOutRows = 150;  // 50 of each task

struct Answered {
  std::string instruction, expected, got;
};

// Greedy answers of the model in `model_dir` to `tasks`, prompted exactly as training renders
// an instruction row (the prompt is the part of the example that carries no loss).
std::vector<Answered> answer(const fs::path& model_dir,
                             const std::vector<runner::DemoTask>& tasks) {
  auto model = model::load_pretrained(model_dir, torch::kFloat32);
  auto tokenizer = hf::Tokenizer::from_folder(model_dir);
  auto config = hf::load_tokenizer_config_from_folder(model_dir);
  data::DatasetFormat format{data::FormatKind::Instruction,
                             {{"instruction", "instruction"}, {"output", "output"}}};
  data::ExampleBuilder builder(format, tokenizer, config);
  model::GenerateOptions options;
  options.max_new_tokens = 12;
  options.eos_token_ids = model::eos_token_ids(model->config(), model_dir);
  std::vector<Answered> out;
  torch::NoGradGuard no_grad;
  for (const auto& task : tasks) {
    data::Row row = {{"instruction", task.instruction}, {"output", task.answer}};
    data::TokenizedExample ex = builder.build(row, "demo");
    std::vector<std::int64_t> prompt;
    for (std::size_t i = 0; i < ex.input_ids.size() && ex.labels[i] == data::kIgnoreIndex; ++i)
      prompt.push_back(ex.input_ids[i]);
    auto result = model::generate(*model, {prompt}, options);
    std::vector<std::int32_t> ids;
    for (auto t : result.tokens[0]) ids.push_back(static_cast<std::int32_t>(t));
    out.push_back({task.instruction, task.answer, tokenizer.decode(ids, /*skip_special=*/true)});
  }
  return out;
}

double accuracy(const std::vector<Answered>& answers) {
  std::size_t right = 0;
  for (const auto& a : answers) right += a.got == a.expected ? 1 : 0;
  return answers.empty() ? 0.0 : static_cast<double>(right) / static_cast<double>(answers.size());
}

// The mean wall time of a training step, from the step metrics of a run's events: the span from
// the first step's end to the last's over the steps between (the first step, with LibTorch's
// warm-up, left out; evaluations and checkpoints that fall between steps are in it).
double mean_step_seconds(const fs::path& events_path) {
  std::ifstream in(events_path);
  std::string line;
  std::vector<double> ends;
  while (std::getline(in, line)) {
    const auto event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (event.is_object() && event.value("type", "") == "metric" && event.contains("loss") &&
        event.contains("t"))
      ends.push_back(event["t"].get<double>());
  }
  if (ends.size() < 2) return 0.0;
  return (ends.back() - ends.front()) / static_cast<double>(ends.size() - 1);
}

// The demo replaces its own files (and its run) in --out. A folder holding anything else, or
// data, a job or a run that the demo's job spec does not vouch for, is refused before anything
// is written, so a user's files there are never overwritten.
void refuse_other_folder(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec))
    throw_invalid("--out " + out.string() + ": exists and is not a folder",
                  "choose a new or empty folder for the demo");
  const std::string hint = "choose a new or empty folder for the demo (--out)";
  // What a demo interrupted midway leaves: dot-files, an export's staged or replaced folders,
  // an atomic write's temporary.
  const auto leftover = [](const std::string& name) {
    return name.starts_with(".") || name.find(".tmp") != std::string::npos ||
           name.starts_with("base.old-");
  };
  static const std::set<std::string> model_files = {"tokenizer", "base"};
  static const std::set<std::string> written_later = {"train.jsonl", "validation.jsonl",
                                                      "test.jsonl", "job.json", "run"};
  bool later = false;
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    if (leftover(name) || model_files.count(name)) continue;
    if (!written_later.count(name))
      throw_invalid("--out " + out.string() + ": the folder holds " + name +
                        ", which is not the demo's: the demo writes its files there and replaces "
                        "its run",
                    hint);
    later = true;
  }
  if (!later) return;  // a demo stopped before its data: its model and tokenizer only
  // The data, the job and the run are the demo's when the demo's job spec is there (written
  // after the data), and the run's own job.json is the demo's too.
  const auto refuse_unless_demo = [&](const fs::path& spec, const std::string& what) {
    if (!fs::exists(spec, ec))
      throw_invalid("--out " + out.string() + ": it holds " + what + " but no job.json of the " +
                        "demo's, which the demo would overwrite",
                    hint);
    std::string name;
    try {
      name = job::load_job_spec(spec).name;
    } catch (const Error& e) {
      throw_invalid("--out " + out.string() + ": " + spec.string() +
                        " could not be read as the demo's job spec (" + e.what() +
                        "), and the demo would overwrite it",
                    hint);
    }
    if (name != "demo")
      throw_invalid("--out " + out.string() + ": " + spec.string() +
                        " is not the demo's job spec, and the demo would overwrite " + what,
                    hint);
  };
  refuse_unless_demo(out / "job.json", "data, a job spec or a run");
  if (fs::exists(out / "run" / "job.json", ec))
    refuse_unless_demo(out / "run" / "job.json", "run/");
}

int run_demo(const std::vector<std::string>& raw) {
  Args args(raw, {"--no-train"}, {"--out", "--steps", "--seed"});
  if (!args.positionals().empty()) throw UsageError{"unexpected argument"};
  const fs::path out = args.option("--out") ? fs::path(*args.option("--out")) : "tessera-demo";
  const std::int64_t steps = args.integer("--steps", kDefaultSteps, 1);
  const auto seed = static_cast<std::uint64_t>(args.integer("--seed", 7, 0));
  const auto started = std::chrono::steady_clock::now();

  refuse_other_folder(out);
  std::fprintf(stderr, "== building the demo model, tokenizer and dataset in %s\n", out.c_str());
  core::create_output_folder(out, "--out");
  const fs::path tokenizer_dir = out / "tokenizer";
  hf::ModelConfig config = runner::write_demo_model_files(tokenizer_dir);
  std::int64_t parameters = 0;
  {
    torch::manual_seed(seed);
    auto model = model::create_model(config, model::TaskHead::CausalLM);
    model::init_weights(*model, seed);
    for (const auto& p : model->parameters()) parameters += p.numel();
    exporter::ExportOptions options;
    options.tokenizer_dir = tokenizer_dir;
    options.force = true;
    exporter::export_pretrained(*model, out / "base", options);
  }
  runner::DemoData data = runner::make_demo_data(kTrainingRows, kHeldOutRows, seed);
  runner::write_demo_jsonl(out / "train.jsonl", data.train);
  runner::write_demo_jsonl(out / "validation.jsonl", data.validation);
  runner::write_demo_jsonl(out / "test.jsonl", data.test);
  std::fprintf(stderr,
               "model: llama, %lld layers × hidden %lld, %.2f M parameters, byte-level "
               "vocabulary of %lld, random weights (seed %llu)\n"
               "tasks: \"first kiwo\" -> k, \"last kiwo\" -> o, \"upper kiwo\" -> KIWO on "
               "words of 3-6 random letters; %zu training rows, %zu held-out rows whose words "
               "are not in training\n",
               static_cast<long long>(config.num_hidden_layers),
               static_cast<long long>(config.hidden_size), static_cast<double>(parameters) / 1e6,
               static_cast<long long>(config.vocab_size), static_cast<unsigned long long>(seed),
               data.train.size(), data.test.size());

  double before = 0;
  if (!args.flag("--no-train")) {
    before = accuracy(answer(out / "base", data.test));
    std::fprintf(stderr, "held-out exact-match accuracy before fine-tuning: %.1f%%\n",
                 100 * before);
  }

  nlohmann::json doc = {{"version", job::kJobSpecVersion},
                        {"name", "demo"},
                        {"model", {{"path", (out / "base").string()}}},
                        {"dataset",
                         {{"train", {(out / "train.jsonl").string()}},
                          {"validation", {(out / "validation.jsonl").string()}},
                          {"format", "instruction"},
                          {"max_length", 32}}},
                        {"method", {{"type", "full"}}},
                        {"training",
                         {{"steps", steps},
                          {"batch_size", kBatchSize},
                          {"learning_rate", kLearningRate},
                          {"schedule", "cosine"},
                          {"warmup_steps", steps / 10},
                          {"weight_decay", 0.01},
                          {"eval_every", std::max<std::int64_t>(1, steps / 5)},
                          {"save_every", std::max<std::int64_t>(1, steps / 2)},
                          {"seed", seed}}},
                        {"output", {{"dir", (out / "run").string()}}}};
  job::JobSpec spec = job::parse_job_spec(doc, "demo");
  job::save_job_spec(spec, out / "job.json");
  if (args.flag("--no-train")) {
    std::printf("demo model: %s\ndataset: %s (validation: %s)\njob spec: %s\n",
                (out / "base").c_str(), (out / "train.jsonl").c_str(),
                (out / "validation.jsonl").c_str(), (out / "job.json").c_str());
    std::printf("train it with: tessera-cli run %s (or open the model and dataset in tessera)\n",
                (out / "job.json").c_str());
    return 0;
  }
  std::fprintf(stderr, "== fine-tuning (job spec: %s)\n", (out / "job.json").c_str());
  const auto training_started = std::chrono::steady_clock::now();
  // The demo's own run folder: an earlier demo's run there is replaced (the demo says so).
  if (fs::exists(out / "run")) {
    std::fprintf(stderr, "== replacing the earlier demo run in %s\n", (out / "run").c_str());
    fs::remove_all(out / "run");
  }
  int code = execute_job(spec, "", (out / "job.json").string());
  if (code != 0) return code;
  const double training_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - training_started).count();

  auto answers = answer(out / "run" / "model", data.test);
  double after = accuracy(answers);
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "\nheld-out exact-match accuracy: %.1f%% before, %.1f%% after fine-tuning (%zu tasks)\n",
      100 * before, 100 * after, answers.size());
  // Per task, against guessing: a random letter is right 1 time in 26.
  for (const char* kind : {"first", "last", "upper"}) {
    std::vector<Answered> of_kind;
    for (const auto& a : answers)
      if (a.instruction.rfind(std::string(kind) + " ", 0) == 0) of_kind.push_back(a);
    std::printf("  %-6s %5.1f%% of %zu  (guessing: %s)\n", kind, 100 * accuracy(of_kind),
                of_kind.size(), std::string(kind) == "upper" ? "~0%" : "3.8%");
  }
  std::printf("exported model: %s (loads with transformers' AutoModelForCausalLM)\n",
              (out / "run" / "model").c_str());
  std::printf("sample generations:\n");
  for (std::size_t i = 0; i < std::min<std::size_t>(6, answers.size()); ++i)
    std::printf("  %-22s -> %-10s %s\n", answers[i].instruction.c_str(), answers[i].got.c_str(),
                answers[i].got == answers[i].expected
                    ? "✓"
                    : ("✗ (want " + answers[i].expected + ")").c_str());
  const double step_seconds = mean_step_seconds(out / "run" / "events.jsonl");
  std::printf(
      "fine-tuning: %lld steps of %lld rows, %.3f s a step; %.0f s with loading, evaluations, "
      "checkpoints and export\n",
      static_cast<long long>(steps), static_cast<long long>(spec.training.batch_size), step_seconds,
      training_seconds);
  std::printf("total time: %.0f s\n", seconds);
  return 0;
}

const RegisterCommand kDemoCommand{{
    "demo",
    "demo [--out DIR] [--steps N] [--seed N] [--no-train]",
    "Offline demo: build a small Llama, fine-tune it on a generated task, show accuracy and "
    "samples (--no-train: only write the model, datasets and job spec)",
    run_demo,
}};

}  // namespace
}  // namespace tessera::cli
