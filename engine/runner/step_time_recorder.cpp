#include "runner/step_time_recorder.h"

#include <ctime>
#include <numeric>

namespace tessera::runner {
namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

void StepTimeRecorder::on_step_time(double seconds) {
  if (written_) return;
  if (!first_) {
    first_ = seconds;
    return;
  }
  after_first_.push_back(seconds);
  if (static_cast<std::int64_t>(after_first_.size()) >= kCalibrationSteps) write();
}

void StepTimeRecorder::finish() {
  if (!written_ && static_cast<std::int64_t>(after_first_.size()) >= kMinSteps) write();
}

void StepTimeRecorder::on_evaluation(double seconds, std::int64_t batches) {
  if (batches <= 0 || !(seconds > 0.0)) return;
  evaluation_seconds_ += seconds;
  evaluation_batches_ += batches;
  if (!written_) return;
  record_.evaluation_batch_seconds = evaluation_seconds_ / static_cast<double>(evaluation_batches_);
  try {
    store_.record(record_);
  } catch (const std::exception& e) {
    events_.log("warning",
                std::string("could not record the measured evaluation time: ") + e.what());
  }
}

void StepTimeRecorder::write() {
  written_ = true;
  plan::StepTimeRecord r;
  r.key = key_;
  // The mean, not the median: the rest of the run meets the same stalls (other processes on the
  // machine) that the measured steps did.
  r.seconds_per_step = std::accumulate(after_first_.begin(), after_first_.end(), 0.0) /
                       static_cast<double>(after_first_.size());
  r.first_step_seconds = first_.value_or(r.seconds_per_step);
  r.steps_measured = static_cast<std::int64_t>(after_first_.size());
  r.run = run_;
  r.recorded_at = utc_now();
  if (evaluation_batches_ > 0)
    r.evaluation_batch_seconds = evaluation_seconds_ / static_cast<double>(evaluation_batches_);
  record_ = r;
  try {
    store_.record(r);
    events_.log("info", "measured " + std::to_string(r.seconds_per_step).substr(0, 6) +
                            " s per step over steps 2–" + std::to_string(r.steps_measured + 1) +
                            " (the first: " + std::to_string(r.first_step_seconds).substr(0, 6) +
                            " s); recorded in " + store_.file().string() +
                            " for later plans of this job");
  } catch (const std::exception& e) {
    // A cache: the run goes on without it.
    events_.log("warning", std::string("could not record the measured step time: ") + e.what());
  }
}

}  // namespace tessera::runner
