#pragma once
// Dynamic loss scaling for fp16 (as torch.amp.GradScaler): the loss is multiplied by `scale`
// before backward; gradients are unscaled before clipping; a step whose gradients hold inf or
// NaN is skipped and the scale is multiplied by `backoff`; after `growth_interval` good steps
// in a row the scale is multiplied by `growth`.
#include <cstdint>

namespace tessera::optim {

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(double initial_scale = 65536.0, double growth = 2.0,
                             double backoff = 0.5, std::int64_t growth_interval = 2000);
  double scale() const { return scale_; }
  // Call once per optimizer step with whether the unscaled gradients were all finite.
  // Returns true when the optimizer step should be applied.
  bool update(bool grads_finite);
  std::int64_t good_steps() const { return good_steps_; }
  void restore(double scale, std::int64_t good_steps);

 private:
  double scale_;
  double growth_;
  double backoff_;
  std::int64_t growth_interval_;
  std::int64_t good_steps_ = 0;
};

}  // namespace tessera::optim
