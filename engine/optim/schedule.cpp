#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace tessera::optim {

ScheduleKind schedule_from_name(const std::string& name) {
  if (name == "constant") return ScheduleKind::Constant;
  if (name == "linear") return ScheduleKind::Linear;
  if (name == "cosine") return ScheduleKind::Cosine;
  throw_invalid("training.schedule: \"" + name + "\" is not a schedule",
                "use constant, linear or cosine");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::Constant:
      return "constant";
    case ScheduleKind::Linear:
      return "linear";
    case ScheduleKind::Cosine:
      return "cosine";
  }
  return "unknown";
}

LrSchedule::LrSchedule(ScheduleKind kind, double base_lr, std::int64_t warmup_steps,
                       std::int64_t total_steps)
    : kind_(kind), base_lr_(base_lr), warmup_(warmup_steps), total_(total_steps) {
  if (warmup_steps < 0) throw_invalid("training.warmup_steps: must be >= 0");
  if (total_steps < 0) throw_invalid("training.steps: must be >= 0");
}

double LrSchedule::factor(std::int64_t step) const {
  // Same arithmetic (in double, as Python floats) as transformers' lambdas.
  if (step < warmup_)
    return static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(1, warmup_));
  switch (kind_) {
    case ScheduleKind::Constant:
      return 1.0;
    case ScheduleKind::Linear:
      return std::max(0.0, static_cast<double>(total_ - step) /
                               static_cast<double>(std::max<std::int64_t>(1, total_ - warmup_)));
    case ScheduleKind::Cosine: {
      const double progress = static_cast<double>(step - warmup_) /
                              static_cast<double>(std::max<std::int64_t>(1, total_ - warmup_));
      const double num_cycles = 0.5;
      return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress)));
    }
  }
  return 1.0;
}

}  // namespace tessera::optim
