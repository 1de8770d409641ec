#include "run_job.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/exit_codes.h"
#include "core/files.h"
#include "dist/environment.h"
#include "dist/parallel_context.h"
#if defined(TESSERA_WITH_HUB)
#include "hub_model.h"
#endif
#include "job/events.h"
#include "runner/runner.h"
#include "train/checkpoint.h"

namespace tessera::cli {
namespace {

#if !defined(TESSERA_WITH_HUB)
[[noreturn]] void refuse_hub_id(const std::string& field) {
  throw_unsupported(
      field + ": this tessera-cli was built without the Hub client " + "(TESSERA_WITH_HUB=OFF)",
      "download it with a build that has the Hub and give a local folder instead");
}
#endif

std::atomic<bool> g_stop{false};
std::atomic<bool> g_training{false};  // the runner's training loop runs (RunOptions)
std::atomic<int> g_interrupts{0};
std::atomic<int> g_stop_signal{SIGINT};  // the first SIGINT or SIGTERM: the exit code says which

void on_interrupt(int signal) {
  // Outside the training loop (loading, reading and tokenizing, the export) there is nothing to
  // checkpoint: leave at once. What is being written is in temporary files named after this
  // process, never under the final names; the next run or export of the folder removes them.
  if (!g_training.load()) {
    const char msg[] = "\nstopped outside the training steps: nothing to checkpoint\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    std::_Exit(core::exit_code_for_signal(signal));
  }
  // First Ctrl-C (or SIGTERM) while training: finish the step, checkpoint, stop. Second: leave at
  // once (the newest complete checkpoint is still intact: checkpoints are written crash-safe).
  if (g_interrupts.fetch_add(1) >= 1) std::_Exit(core::exit_code_for_signal(signal));
  g_stop_signal.store(signal);
  g_stop.store(true);
  const char msg[] = "\nstopping after this step (Ctrl-C again to quit at once)\n";
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

std::string format_eta(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "--:--";
  auto s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", s / 60, s % 60);
  return buf;
}

// Renders metric/progress events as one updating line on a terminal (stderr), and plain
// lines when stderr is not a terminal.
class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(STDERR_FILENO) == 1) {}

  void on_event(const nlohmann::json& e) {
    const std::string type = e.value("type", "");
    if (type == "progress" && e.value("phase", "") == "train") {
      phase_.clear();
      done_ = e.value("done", 0);
      total_ = e.value("total", 0);
      if (e.contains("eta_s") && e["eta_s"].is_number()) eta_ = e["eta_s"].get<double>();
      draw();
    } else if (type == "progress" && kPhaseUnits.contains(e.value("phase", ""))) {
      // What takes a while before and between the steps: fetching from the Hub, tokenizing,
      // an evaluation.
      phase_ = e.value("phase", "");
      phase_done_ = e.value("done", std::int64_t{0});
      phase_total_ = e.value("total", std::int64_t{0});
      phase_eta_ = e.contains("eta_s") && e["eta_s"].is_number() ? e["eta_s"].get<double>() : -1;
      draw_phase();
    } else if (type == "metric") {
      if (e.contains("loss") && e["loss"].is_number()) loss_ = e["loss"].get<double>();
      if (e.contains("tokens_per_s") && e["tokens_per_s"].is_number())
        tokens_per_s_ = e["tokens_per_s"].get<double>();
      if (e.contains("eval_loss") && e["eval_loss"].is_number()) {
        clear();
        if (e.contains("accuracy"))
          std::fprintf(stderr, "eval at step %lld: loss %.4f, accuracy %.1f%%\n",
                       static_cast<long long>(e.value("step", 0)), e["eval_loss"].get<double>(),
                       100.0 * e.value("accuracy", 0.0));
        else if (e.contains("eval_preference") && e["eval_preference"].is_object()) {
          // A preference loss has no perplexity: its rewards say how the pairs are told apart.
          const nlohmann::json& p = e["eval_preference"];
          char figures[96];
          if (p.contains("reward_accuracy"))
            std::snprintf(figures, sizeof figures, "reward margin %.4f, reward accuracy %.1f%%",
                          p.value("reward_margin", 0.0), 100.0 * p.value("reward_accuracy", 0.0));
          else
            std::snprintf(figures, sizeof figures, "reward margin %.4f",
                          p.value("reward_margin", 0.0));
          std::fprintf(stderr, "eval at step %lld: loss %.4f, %s\n",
                       static_cast<long long>(e.value("step", 0)), e["eval_loss"].get<double>(),
                       figures);
        } else
          std::fprintf(stderr, "eval at step %lld: loss %.4f, perplexity %.2f\n",
                       static_cast<long long>(e.value("step", 0)), e["eval_loss"].get<double>(),
                       e.value("perplexity", 0.0));
      }
      draw();
    } else if (type == "log" && e.value("level", "") != "debug") {
      clear();
      std::fprintf(stderr, "%s\n", e.value("message", "").c_str());
      draw();
    } else if (type == "checkpoint") {
      clear();
      std::fprintf(stderr, "saved %s\n", e.value("path", "").c_str());
      draw();
    }
  }

  void finish() {
    if (drawn_ && tty_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  void clear() {
    if (drawn_ && tty_) std::fputs("\r\033[K", stderr);
  }
  void draw() {
    if (!phase_.empty()) return draw_phase();
    if (total_ <= 0) return;
    char line[256];
    const int width = 24;
    int filled = static_cast<int>(width * static_cast<double>(done_) / static_cast<double>(total_));
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '.');
    std::snprintf(line, sizeof line, "step %lld/%lld [%s] loss %.4f  %.0f tok/s  ETA %s",
                  static_cast<long long>(done_), static_cast<long long>(total_), bar.c_str(), loss_,
                  tokens_per_s_, format_eta(eta_).c_str());
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line);
      drawn_ = true;
    } else if (done_ != last_printed_ && (done_ % 10 == 0 || done_ == total_)) {
      std::fprintf(stderr, "%s\n", line);
      last_printed_ = done_;
    }
    std::fflush(stderr);
  }

  void draw_phase() {
    if (phase_total_ <= 0) return;
    const bool finished = phase_done_ >= phase_total_;
    const auto now = std::chrono::steady_clock::now();
    // A log keeps a line every 5 s and the last; a terminal redraws its line.
    if (!tty_ && !finished && now - phase_printed_at_ < std::chrono::seconds(5)) return;
    phase_printed_at_ = now;
    const double share =
        static_cast<double>(phase_done_) / static_cast<double>(phase_total_) * 100.0;
    const std::string& unit = kPhaseUnits.at(phase_);
    char line[256];
    if (unit == "bytes")
      std::snprintf(
          line, sizeof line, "%s: %s of %s (%.0f%%)", phase_.c_str(),
          core::human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(0, phase_done_)))
              .c_str(),
          core::human_bytes(static_cast<std::uint64_t>(phase_total_)).c_str(), share);
    else
      std::snprintf(line, sizeof line, "%s: %lld/%lld %s (%.0f%%)%s%s", phase_.c_str(),
                    static_cast<long long>(phase_done_), static_cast<long long>(phase_total_),
                    unit.c_str(), share, phase_eta_ >= 0 ? "  ETA " : "",
                    phase_eta_ >= 0 ? format_eta(phase_eta_).c_str() : "");
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line);
      drawn_ = true;
    } else {
      std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
    if (finished) phase_.clear();  // the steps' line again
  }

  // The phases drawn beside training's steps, and what they count.
  inline static const std::map<std::string, std::string> kPhaseUnits = {
      {"download", "bytes"}, {"tokenize", "rows"}, {"eval", "batches"}};

  bool tty_;
  bool drawn_ = false;
  std::int64_t done_ = 0, total_ = 0, last_printed_ = -1;
  double loss_ = 0, tokens_per_s_ = 0, eta_ = -1;
  std::string phase_;
  std::int64_t phase_done_ = 0, phase_total_ = 0;
  double phase_eta_ = -1;
  std::chrono::steady_clock::time_point phase_printed_at_{};
};

// This process's rank when it is one of several (torchrun's variables), else 0. A bad variable
// counts as rank 0 here, so that the runner's error naming it reaches the event stream.
int rank_from_environment() {
  try {
    return dist::read_dist_environment().rank;
  } catch (const Error&) {
    return 0;
  }
}

// What of an earlier run `dir` holds that a new run there would put at risk: its complete
// checkpoints and its export ("checkpoint-4, model/"); empty when there is none.
std::string earlier_run_in(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool checkpoint = train::checkpoint_step(name).has_value();
    if (entry.is_directory(ec) && (checkpoint || name == "model" || name == "adapter"))
      found.push_back(checkpoint ? name : name + "/");
  }
  std::sort(found.begin(), found.end());
  std::string text;
  for (const std::string& f : found) text += (text.empty() ? "" : ", ") + f;
  return text;
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown host";
  return name;
}

}  // namespace

void refuse_new_run_over_earlier(const job::JobSpec& spec, const std::string& resume_command) {
  if (spec.output.resume) return;
  if (const std::string earlier = earlier_run_in(spec.output.dir); !earlier.empty())
    throw_invalid(spec.output.dir + " already holds a run (" + earlier +
                      "): a new run there would replace its job.json and event stream",
                  "resume it with `" + resume_command +
                      "`, or choose another output folder (output.dir in the job spec; "
                      "finetune's --out)");
}

int execute_job(const job::JobSpec& spec, const std::string& events_target,
                const std::string& spec_path, std::optional<std::uint64_t> simulate_host_memory) {
  namespace fs = std::filesystem;
  refuse_new_run_over_earlier(
      spec,
      "tessera-cli run " +
          (spec_path.empty() ? (fs::path(spec.output.dir) / "job.json").string() : spec_path) +
          " --resume " + spec.output.dir);
  core::create_output_folder(spec.output.dir, "--out (output.dir in the job spec)");
  // One of several processes: rank 0 alone writes the stream (and draws the progress bar); the
  // others report through its events (train/trainer.h), and their errors go to stderr.
  const int rank = rank_from_environment();
  const bool distributed =
      std::getenv("WORLD_SIZE") && std::string(std::getenv("WORLD_SIZE")) != "1";
  job::EventSink events;
  if (rank == 0)
    events.open(events_target.empty() ? (fs::path(spec.output.dir) / "events.jsonl").string()
                                      : events_target,
                /*append=*/spec.output.resume.has_value());
  ProgressBar bar;
  // With the events on stdout a program reads them (the studio); stderr then carries only
  // what the stream does not, so the reader does not see every log line twice.
  if (events_target != "-" && rank == 0)
    events.set_listener([&](const nlohmann::json& e) { bar.on_event(e); });

  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);

  try {
    runner::RunOptions options;
    options.stop = &g_stop;
    options.stopping_at_step_end = &g_training;
    options.simulate_host_memory = simulate_host_memory;
    job::JobSpec local = spec;  // model.hub_id → the snapshot folder in the HF cache
#if defined(TESSERA_WITH_HUB)
    if (local.model.path.empty() && !local.model.hub_id.empty())
      local.model.path = fetch_hub_model(local, events, &g_stop).string();
    if (!local.dataset.hub_id.empty())  // dataset.hub_id → its files in the HF cache
      local.dataset = fetch_hub_dataset(local.dataset, events, &g_stop);
#else
    if (local.model.path.empty() && !local.model.hub_id.empty()) refuse_hub_id("model.hub_id");
    if (!local.dataset.hub_id.empty()) refuse_hub_id("dataset.hub_id");
#endif
    runner::RunOutcome outcome = runner::run_job(local, events, options);
    bar.finish();
    nlohmann::json done = {{"status", outcome.status},
                           {"steps", outcome.steps_done},
                           {"total_steps", outcome.total_steps}};
    if (outcome.final_loss) done["final_loss"] = *outcome.final_loss;
    if (outcome.final_eval_loss) done["final_eval_loss"] = *outcome.final_eval_loss;
    if (outcome.model_dir) done["output"] = outcome.model_dir->string();
    if (outcome.adapter_dir) done["adapter"] = outcome.adapter_dir->string();
    events.emit("done", done);
    const int stopped_code = core::exit_code_for_signal(g_stop_signal.load());
    if (rank != 0) return outcome.status == "stopped" ? stopped_code : core::kExitDone;
    if (outcome.status == "stopped") {
      std::fprintf(stderr, "stopped at step %lld of %lld; checkpoint: %s\n",
                   static_cast<long long>(outcome.steps_done),
                   static_cast<long long>(outcome.total_steps),
                   outcome.last_checkpoint ? outcome.last_checkpoint->c_str() : "(none)");
      // Resumed as it ran: a job of several processes by launch with as many (a single process
      // would train half the sequences a step).
      const std::string job_path =
          spec_path.empty() ? (fs::path(spec.output.dir) / "job.json").string() : spec_path;
      std::string resume = "tessera-cli run " + job_path + " --resume " + spec.output.dir;
      if (distributed) {
        const char* world = std::getenv("WORLD_SIZE");
        const char* local = std::getenv("LOCAL_WORLD_SIZE");
        resume = local && std::string(local) == world
                     ? "tessera-cli launch --nproc " + std::string(world) + " " + job_path +
                           " --resume " + spec.output.dir
                     : "tessera-cli launch " + job_path + " --resume " + spec.output.dir +
                           " on the same nodes (--nodes, or the spec's nodes)";
      }
      std::fprintf(stderr, "resume with: %s\n", resume.c_str());
      return stopped_code;
    }
    std::fprintf(stderr, "done: %lld steps", static_cast<long long>(outcome.steps_done));
    if (outcome.final_loss) std::fprintf(stderr, ", final loss %.4f", *outcome.final_loss);
    if (outcome.final_eval_loss) std::fprintf(stderr, ", eval loss %.4f", *outcome.final_eval_loss);
    std::fprintf(stderr, "\nmodel: %s\n", outcome.model_dir ? outcome.model_dir->c_str() : "-");
    if (outcome.adapter_dir) std::fprintf(stderr, "adapter: %s\n", outcome.adapter_dir->c_str());
    return 0;
  } catch (const dist::PeerFailure& e) {
    // Another rank died, hangs or cannot be reached: the event names it and its host.
    bar.finish();
    events.emit("error", {{"code", error_kind_name(e.kind())},
                          {"message", e.what()},
                          {"hint", e.hint()},
                          {"rank", e.failed_rank()},
                          {"host", e.failed_host()}});
    events.emit("done", {{"status", "failed"}});
    throw;
  } catch (const Error& e) {
    bar.finish();
    nlohmann::json error = {
        {"code", error_kind_name(e.kind())}, {"message", e.what()}, {"hint", e.hint()}};
    if (distributed) {  // it happened here, on rank 0
      error["rank"] = rank;
      error["host"] = hostname();
    }
    events.emit("error", error);
    events.emit("done", {{"status", "failed"}});
    throw;
  } catch (const std::exception& e) {
    bar.finish();
    events.error("internal", e.what(), "");
    events.emit("done", {{"status", "failed"}});
    throw;
  }
}

}  // namespace tessera::cli
