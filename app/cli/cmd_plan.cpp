// tessera-cli plan JOB.json [--nproc N] [--json]: the strategy and settings the engine would
// choose for a job on this machine, with the estimated peak memory per tier and category against
// what is available, and the estimated time. With --nproc N (launch --nproc N), one rank's plan:
// its share of the memory, its step with the communication at the measured link, and the
// strategies weighed. A job that cannot fit exits 2 with the numbers.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "job/job_spec.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/strategy_costs.h"
#include "runner/runner.h"

namespace tessera::cli {

plan::HardwareProfile profile_from_args(const Args& args, std::filesystem::path disk_dir,
                                        bool measure_disk, bool measure_link);

namespace {
namespace fs = std::filesystem;
using core::human_bytes;
using nlohmann::json;

std::string duration(double seconds) {
  char buf[48];
  if (seconds < 120)
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  else if (seconds < 7200)
    std::snprintf(buf, sizeof buf, "%.1f min", seconds / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f h", seconds / 3600);
  return buf;
}

void print_plan(const plan::Plan& p) {
  const auto& s = p.settings;
  std::printf("%s\n\n", p.explanation.c_str());
  std::printf("strategy:      %s%s\n", p.strategy.c_str(),
              s.strategy == "zero" ? (" stage " + std::to_string(s.zero_stage)).c_str() : "");
  if (p.processes > 1)
    std::printf("processes:     %d (%d on this machine); memory and time below are one rank's\n",
                p.processes, p.processes_per_node);
  std::printf(
      "method:        %s\n",
      s.method == "lora" ? ("lora (rank " + std::to_string(s.lora_rank) + ")").c_str() : "full");
  std::printf("precision:     %s\n", s.precision.c_str());
  std::printf("micro-batch:   %lld x %lld accumulation steps, sequence %lld\n",
              static_cast<long long>(s.micro_batch),
              static_cast<long long>(s.gradient_accumulation),
              static_cast<long long>(s.sequence_length));
  std::printf("checkpointing: %s\n", s.activation_checkpointing ? "on" : "off");
  std::printf("parameters:    %lld total, %lld trainable",
              static_cast<long long>(p.total_parameters),
              static_cast<long long>(p.trainable_parameters));
  if (p.checkpoint_parameters)
    std::printf(" (checkpoint holds %lld)", static_cast<long long>(*p.checkpoint_parameters));
  std::printf("\n");
  for (const auto& t : p.tiers) {
    const auto& e = t.estimate;
    // The disk tier holds its files; the host's floors do not apply to it (as in --json).
    const bool disk = t.tier == "disk";
    std::printf("\nmemory, %s (%s): peak %s of %s%s, %.0f%% kept as headroom\n", t.tier.c_str(),
                t.device.c_str(), human_bytes(disk ? e.training_peak() : e.peak()).c_str(),
                human_bytes(t.budget).c_str(), t.simulated ? " (simulated)" : "",
                plan::kHeadroom * 100);
    std::printf(
        "  weights      %s\n  gradients    %s%s\n  optimizer    %s\n"
        "  activations  %s\n  runtime      %s\n",
        human_bytes(e.weights).c_str(), human_bytes(e.gradients).c_str(),
        e.gradient_buckets > 0
            ? (" (" + human_bytes(e.gradient_buckets) + " of float32 buckets)").c_str()
            : "",
        human_bytes(e.optimizer).c_str(), human_bytes(e.activations).c_str(),
        human_bytes(e.runtime).c_str());
    if (disk) continue;
    if (e.peak() == plan::kRuntimeFloorBytes && e.training_peak() < e.peak())
      std::printf("  (the peak is the runtime's measured floor, %s, whatever the model needs)\n",
                  human_bytes(plan::kRuntimeFloorBytes).c_str());
    else if (e.load_peak > e.training_peak() && e.load_peak >= e.export_peak)
      std::printf("  (the peak is while loading: weights plus the mapped checkpoint, %s)\n",
                  human_bytes(e.load_peak).c_str());
    else if (e.save_peak > e.training_peak() && e.save_peak >= e.export_peak)
      std::printf(
          "  (the peak is a checkpoint: the trained tensors and their moments gathered "
          "whole beside the training state, %s)\n",
          human_bytes(e.save_peak).c_str());
    else if (e.export_peak > e.training_peak())
      std::printf("  (the peak is the export: the fp32 model and its reload check, %s)\n",
                  human_bytes(e.export_peak).c_str());
  }
  std::printf("\ntime%s  %s per step",
              p.calibration ? ":        " : " (rough):", duration(p.seconds_per_step).c_str());
  if (p.total_seconds())
    std::printf(", %s for %lld steps%s", duration(*p.total_seconds()).c_str(),
                static_cast<long long>(*p.total_steps),
                p.evaluations > 0 ? (" and " + std::to_string(p.evaluations) +
                                     (p.evaluations == 1 ? " evaluation (" : " evaluations (") +
                                     duration(p.seconds_per_evaluation) + " each)")
                                        .c_str()
                                  : "");
  std::printf("\n               %s\n", p.time_source.c_str());
  if (p.processes > 1) {
    std::printf("communication: %s per step in %lld calls, %s (link: %s)\n",
                human_bytes(p.communication.bytes).c_str(),
                static_cast<long long>(p.communication.calls),
                p.communication.seconds > 0 ? duration(p.communication.seconds).c_str()
                                            : "time not estimated",
                p.link_source.c_str());
    if (p.candidates.size() > 1) {
      // Every layout weighed, as the studio's table shows them: the chosen first (*), then
      // those that fit in the order auto ranks them, then the others ("-": not at any
      // micro-batch; their figures are at micro-batch 1 with checkpointing).
      // Padded by characters, not bytes: the phrases hold "×".
      auto characters = [](const std::string& text) {
        return static_cast<std::size_t>(
            std::count_if(text.begin(), text.end(), [](char ch) { return (ch & 0xC0) != 0x80; }));
      };
      std::size_t width = 8;
      for (const auto& c : p.candidates)
        width = std::max(width, 2 + characters(plan::strategy_phrase(c.settings)));
      auto padded = [&](std::string text) {
        text.append(width - std::min(width, characters(text)), ' ');
        return text;
      };
      std::printf("\nlayouts weighed (per rank):\n  %s %5s %6s %10s %10s %8s %7s\n",
                  padded("layout").c_str(), "fits", "micro", "peak", "step", "comm", "bubble");
      for (const auto& c : p.candidates) {
        const std::string layout = (c.chosen ? "* " : "  ") + plan::strategy_phrase(c.settings);
        const std::string micro = std::to_string(c.settings.micro_batch) +
                                  (c.settings.activation_checkpointing ? "c" : "");
        const std::string bubble =
            c.bubble > 0.0 ? std::to_string(static_cast<int>(c.bubble * 100 + 0.5)) + "%" : "";
        std::printf("  %s %5s %6s %10s %10s %8s %7s\n", padded(layout).c_str(),
                    c.fits ? "yes" : "-", micro.c_str(), human_bytes(c.peak).c_str(),
                    duration(c.seconds_per_step).c_str(), duration(c.communication_seconds).c_str(),
                    bubble.c_str());
      }
      std::printf(
          "  (micro: micro-batch per rank, c: with activation checkpointing; step: the cost "
          "model's, alike for every layout%s)\n",
          p.calibration ? ", where the time above is measured on this machine" : "");
    }
  }
  if (!p.reasons.empty()) {
    std::printf("\nwhy:\n");
    for (const auto& r : p.reasons) std::printf("  - %s\n", r.c_str());
  }
}

int run_plan(const std::vector<std::string>& raw) {
  Args args(raw, {"--json", "--measure-disk", "--no-cache"},
            {"--simulate-host-memory", "--disk-bytes", "--nproc"});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one JOB.json"};
  const int nproc = static_cast<int>(args.integer("--nproc", 1, 1, kMaxProcesses));
  const fs::path spec_path = args.positionals()[0];
  const job::JobSpec spec = job::load_job_spec(spec_path);
  // Free disk of the folder the disk tier writes (gemini's offload_dir, else the output folder),
  // or of its nearest existing parent before the first run.
  const auto offload_dir = spec.strategy.options.find("offload_dir");
  const fs::path disk_dir = core::nearest_existing(
      spec.strategy.name == "gemini" && offload_dir != spec.strategy.options.end()
          ? fs::path(offload_dir->get<std::string>())
      : spec.output.dir.empty() ? fs::path(".")
                                : fs::path(spec.output.dir));
  // Several processes: the link between two local ranks is measured (cached a day) for the time.
  plan::HardwareProfile profile = profile_from_args(args, disk_dir, args.flag("--measure-disk"),
                                                    nproc > 1 || spec.nodes.has_value());
  plan::PlanInputs inputs = plan::load_plan_inputs(spec, spec_path.string(), std::move(profile));
  inputs.processes = nproc;
  inputs.processes_per_node = nproc;  // launch --nproc N: all of them on this machine
  // The spec's nodes (launch across LAN nodes) when --nproc does not say otherwise: every node's
  // ranks, this machine's sharing its memory and cores.
  if (spec.nodes && !args.option("--nproc")) {
    int total = 0, here = 0;
    for (const auto& node : spec.nodes->ranks_per_node) {
      total += node.nproc;
      if (node.name == job::kLocalNode) here = node.nproc;
    }
    inputs.processes = std::max(1, total);
    inputs.processes_per_node = here > 0 ? here : inputs.processes;
  }
  // A preference reference that is no model folder, or another vocabulary's, as the run checks.
  if (!spec.model.path.empty()) runner::check_preference_reference(spec, spec.model.path);
  // gemini's host_budget: the job as written is checked against it as the run checks it (the
  // plan's own budget is the machine's memory).
  if (const auto refusal = plan::check_host_budget(inputs))
    throw_invalid(refusal->message, refusal->hint);
  const plan::Plan result = plan::make_plan(inputs);
  if (args.flag("--json")) {
    json out = plan::to_json(result);
    out["profile"] = plan::to_json(inputs.profile);
    std::cout << out.dump(2) << "\n";
  } else {
    print_plan(result);
  }
  if (!result.fits) {
    std::fprintf(stderr, "error: %s: %s\n", spec_path.string().c_str(), result.explanation.c_str());
    return 2;
  }
  return 0;
}

const RegisterCommand kPlanCommand{{
    "plan",
    "plan JOB.json [--nproc N] [--json] [--measure-disk] [--simulate-host-memory SIZE]",
    "Choose the strategy and settings for a job on this machine (as N processes with --nproc) "
    "and estimate its memory and time",
    run_plan,
}};

}  // namespace
}  // namespace tessera::cli
