#include "optim/loss_scaler.h"

#include "core/error.h"

namespace tessera::optim {

DynamicLossScaler::DynamicLossScaler(double initial_scale, double growth, double backoff,
                                     std::int64_t growth_interval)
    : scale_(initial_scale), growth_(growth), backoff_(backoff), growth_interval_(growth_interval) {
  if (!(initial_scale > 0.0) || !(growth > 1.0) || !(backoff > 0.0 && backoff < 1.0) ||
      growth_interval < 1)
    throw_invalid("loss scaler: need scale > 0, growth > 1, 0 < backoff < 1, interval >= 1");
}

bool DynamicLossScaler::update(bool grads_finite) {
  if (!grads_finite) {
    scale_ *= backoff_;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ >= growth_interval_) {
    scale_ *= growth_;
    good_steps_ = 0;
  }
  return true;
}

void DynamicLossScaler::restore(double scale, std::int64_t good_steps) {
  if (!(scale > 0.0) || good_steps < 0) throw_invalid("loss scaler: invalid saved state");
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace tessera::optim
