// tessera-cli plan JOB.json [--json]: the strategy and settings the engine would choose for a
// job on this machine, with the estimated peak memory per tier and category against what is
// available, and the estimated time. A job that cannot fit exits 2 with the numbers.
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

namespace tessera::cli {

plan::HardwareProfile profile_from_args(const Args& args, std::filesystem::path disk_dir,
                                        bool measure_disk);

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
  std::printf("strategy:      %s\n", p.strategy.c_str());
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
    std::printf("\nmemory, %s (%s): peak %s of %s%s, %.0f%% kept as headroom\n", t.tier.c_str(),
                t.device.c_str(), human_bytes(e.peak()).c_str(), human_bytes(t.budget).c_str(),
                t.simulated ? " (simulated)" : "", plan::kHeadroom * 100);
    std::printf(
        "  weights      %s\n  gradients    %s\n  optimizer    %s\n"
        "  activations  %s\n  runtime      %s\n",
        human_bytes(e.weights).c_str(), human_bytes(e.gradients).c_str(),
        human_bytes(e.optimizer).c_str(), human_bytes(e.activations).c_str(),
        human_bytes(e.runtime).c_str());
    if (e.peak() == plan::kRuntimeFloorBytes && e.training_peak() < e.peak())
      std::printf("  (the peak is the runtime's measured floor, %s, whatever the model needs)\n",
                  human_bytes(plan::kRuntimeFloorBytes).c_str());
    else if (e.load_peak > e.training_peak() && e.load_peak >= e.export_peak)
      std::printf("  (the peak is while loading: weights plus the mapped checkpoint, %s)\n",
                  human_bytes(e.load_peak).c_str());
    else if (e.export_peak > e.training_peak())
      std::printf("  (the peak is the export: the fp32 model and its reload check, %s)\n",
                  human_bytes(e.export_peak).c_str());
  }
  std::printf("\ntime%s  %s per step",
              p.calibration ? ":        " : " (rough):", duration(p.seconds_per_step).c_str());
  if (p.total_seconds())
    std::printf(", %s for %lld steps", duration(*p.total_seconds()).c_str(),
                static_cast<long long>(*p.total_steps));
  std::printf("\n               %s\n", p.time_source.c_str());
  if (!p.reasons.empty()) {
    std::printf("\nwhy:\n");
    for (const auto& r : p.reasons) std::printf("  - %s\n", r.c_str());
  }
}

int run_plan(const std::vector<std::string>& raw) {
  Args args(raw, {"--json", "--measure-disk", "--no-cache"},
            {"--simulate-host-memory", "--disk-bytes"});
  if (args.positionals().size() != 1) throw UsageError{"expected exactly one JOB.json"};
  const fs::path spec_path = args.positionals()[0];
  const job::JobSpec spec = job::load_job_spec(spec_path);
  // Free disk of the output folder, or of its nearest existing parent before the first run.
  fs::path disk_dir = spec.output.dir.empty() ? fs::path(".") : fs::absolute(spec.output.dir);
  while (!fs::exists(disk_dir) && disk_dir.has_parent_path() && disk_dir != disk_dir.parent_path())
    disk_dir = disk_dir.parent_path();
  plan::HardwareProfile profile = profile_from_args(args, disk_dir, args.flag("--measure-disk"));
  const plan::PlanInputs inputs =
      plan::load_plan_inputs(spec, spec_path.string(), std::move(profile));
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

const RegisterCommand kRegister{{
    "plan",
    "plan JOB.json [--json] [--measure-disk] [--simulate-host-memory SIZE]",
    "Choose the strategy and settings for a job on this machine and estimate its memory and time",
    run_plan,
}};

}  // namespace
}  // namespace tessera::cli
