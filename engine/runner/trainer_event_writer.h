#pragma once
// The trainer's callbacks (train/trainer_events.h) as the job's event stream
// (job/events.h, docs/events.md): `metric`, `memory`, `checkpoint`, `progress` and `log`.
#include "job/events.h"
#include "runner/step_time_recorder.h"
#include "train/trainer_events.h"

namespace tessera::runner {

// Preference tuning's figures as events carry them (docs/events.md): means over every rank's
// pairs (or KTO's examples), the reward accuracy for pairs, the KL estimate for KTO.
nlohmann::json preference_json(const train::PreferenceMetrics& metrics);

class TrainerEventWriter : public train::TrainerEvents {
 public:
  explicit TrainerEventWriter(job::EventSink& sink) : sink_(sink) {}

  void on_step(const train::StepReport& report) override;
  void on_eval(const train::EvalResult& result) override;
  void on_memory(const train::MemoryReport& report) override;
  void on_checkpoint(std::int64_t step, const std::filesystem::path& path) override;
  void on_progress(const std::string& phase, std::int64_t done, std::int64_t total,
                   std::optional<double> eta_seconds) override;
  void on_log(const std::string& level, const std::string& message) override;
  void on_step_time(std::int64_t step, double seconds) override;

  // Step times go to `recorder` too (nullptr: nowhere); it must outlive the training.
  void record_step_times(StepTimeRecorder* recorder) { recorder_ = recorder; }

 private:
  job::EventSink& sink_;
  StepTimeRecorder* recorder_ = nullptr;
};

}  // namespace tessera::runner
