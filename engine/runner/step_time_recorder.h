#pragma once
// Records this machine's measured step time for a run's job (plan/step_times.h) after its
// first steps, so that later plans of the same or a similar job start from the measurement.
#include <cstdint>
#include <optional>
#include <vector>

#include "job/events.h"
#include "plan/step_times.h"

namespace tessera::runner {

class StepTimeRecorder {
 public:
  // Steps measured after the first (whose warm-up is recorded apart) before the record is
  // written; a shorter run records what it measured when it ends, from kMinSteps on.
  static constexpr std::int64_t kCalibrationSteps = 20;
  static constexpr std::int64_t kMinSteps = 5;

  StepTimeRecorder(plan::StepTimeStore store, plan::StepTimeKey key, std::string run,
                   job::EventSink& events)
      : store_(std::move(store)), key_(std::move(key)), run_(std::move(run)), events_(events) {}

  // Every step's wall time, in order; writes the record once kCalibrationSteps are in.
  void on_step_time(double seconds);
  // The run's training ended (completed or stopped): records a shorter measurement.
  void finish();
  // An evaluation of `batches` forwards took `seconds`: kept in the record (written again when
  // it is written already, else with it).
  void on_evaluation(double seconds, std::int64_t batches);

 private:
  void write();

  plan::StepTimeStore store_;
  plan::StepTimeKey key_;
  std::string run_;
  job::EventSink& events_;
  std::optional<double> first_;
  std::vector<double> after_first_;
  double evaluation_seconds_ = 0.0;
  std::int64_t evaluation_batches_ = 0;
  plan::StepTimeRecord record_;  // as written
  bool written_ = false;
};

}  // namespace tessera::runner
