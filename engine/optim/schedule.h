#pragma once
// Learning-rate schedules with linear warmup, identical to transformers'
// get_constant_schedule_with_warmup, get_linear_schedule_with_warmup and
// get_cosine_schedule_with_warmup (num_cycles 0.5). `factor(step)` is the multiplier of the
// base learning rate for the optimizer update number `step` (0-based), i.e. the LambdaLR value
// after `step` scheduler steps.
#include <cstdint>
#include <string>

namespace tessera::optim {

enum class ScheduleKind { Constant, Linear, Cosine };

// "constant", "linear", "cosine"; anything else is tessera::Error (InvalidInput) naming it.
ScheduleKind schedule_from_name(const std::string& name);
const char* schedule_name(ScheduleKind kind);

class LrSchedule {
 public:
  LrSchedule(ScheduleKind kind, double base_lr, std::int64_t warmup_steps,
             std::int64_t total_steps);
  double factor(std::int64_t step) const;
  double lr(std::int64_t step) const { return base_lr_ * factor(step); }
  double base_lr() const { return base_lr_; }

 private:
  ScheduleKind kind_;
  double base_lr_;
  std::int64_t warmup_;
  std::int64_t total_;
};

}  // namespace tessera::optim
