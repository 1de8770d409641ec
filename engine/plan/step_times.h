#pragma once
// Measured step times of this machine: after a run's first steps the runner records how long a
// step took for that job's settings, and later plans of the same or a similar job start from
// that measurement instead of the cost model alone. One small JSON file next to the hardware
// profile's cache (~/.cache/tessera/step_times.json), rewritten atomically. Torch-free.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hf/config.h"
#include "plan/profile.h"
#include "plan/settings.h"

namespace tessera::plan {

// What a step's time depends on, as recorded: where it ran, which model (by its shapes, not
// its folder: the same model anywhere costs the same) and the plan's settings.
struct StepTimeKey {
  std::string device;  // "cpu: <model name> × <physical cores>" or "cuda: <GPU name>"
  std::string model;   // model_fingerprint()
  Settings settings;
  // The job's processes (a run of several records its slowest rank's step, communication
  // included, from rank 0).
  int processes = 1;
};

struct StepTimeRecord {
  StepTimeKey key;
  double seconds_per_step = 0.0;    // mean of the measured steps after the first
  double first_step_seconds = 0.0;  // the first step (LibTorch's warm-up included)
  std::int64_t steps_measured = 0;  // steps behind seconds_per_step
  // A run with a validation set: the mean seconds of one evaluation batch (a forward of
  // micro_batch sequences without gradients) over its evaluations so far; 0 when none ran.
  double evaluation_batch_seconds = 0.0;
  std::string run;          // the run's folder
  std::string recorded_at;  // UTC
};

// "llama L4 H128 I344 A4/4 V259": the shapes that set a step's cost.
std::string model_fingerprint(const hf::ModelConfig& config);
// The device a plan for `profile` runs on (the GPU's when it has one and `on_gpu`).
std::string step_time_device(const HardwareProfile& profile, bool on_gpu);

// The same device, model, method, precision, strategy, processes and checkpointing: a step's
// cost then
// scales with the tokens per step (micro-batch, sequence length, accumulation) as the cost
// model says.
bool similar(const StepTimeKey& a, const StepTimeKey& b);
bool same(const StepTimeKey& a, const StepTimeKey& b);

class StepTimeStore {
 public:
  // ~/.cache/tessera/step_times.json ($XDG_CACHE_HOME/tessera when set), beside profile.json.
  static std::filesystem::path default_path();
  explicit StepTimeStore(std::filesystem::path file) : file_(std::move(file)) {}

  // Every record; a file that cannot be read or parsed, or a record with missing or absurd
  // fields, is skipped with a line in `warnings` naming the file and what is wrong (the store
  // is a cache: a bad one must never stop a plan).
  std::vector<StepTimeRecord> load(std::vector<std::string>* warnings) const;
  // Replaces the record of the same key (the newest measurement wins), keeps the newest
  // kMaxRecords, and rewrites the file atomically under a lock (two runs finishing together
  // lose nothing). Throws tessera::Error when the file cannot be written.
  void record(const StepTimeRecord& record) const;

  const std::filesystem::path& file() const { return file_; }
  static constexpr std::size_t kMaxRecords = 256;

 private:
  std::filesystem::path file_;
};

}  // namespace tessera::plan
