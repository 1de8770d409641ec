#include "train/mixed_precision.h"

#include <cmath>

#include "core/error.h"
#include "train/plugin.h"

namespace tessera::train {

MixedPrecision::MixedPrecision(Precision precision, torch::Device device)
    : precision_(precision), compute_dtype_(compute_dtype_of(precision)) {
  if (precision == Precision::Fp16 && !device.is_cuda())
    throw_unsupported("precision fp16 is not supported on the CPU yet",
                      "use bf16 (or fp32) on the CPU; fp16 with loss scaling needs CUDA");
}

double MixedPrecision::backward_multiplier(double multiplier) const {
  return precision_ == Precision::Fp16 ? multiplier * scaler_.scale() : multiplier;
}

torch::Tensor MixedPrecision::master_gradient(const torch::Tensor& compute_gradient) const {
  torch::Tensor g = compute_gradient.to(torch::kFloat32);
  // Unscale a copy: in fp16 .to() above already copied, so this never touches autograd's.
  if (const double divisor = gradient_divisor(); divisor != 1.0) g.div_(divisor);
  return g;
}

double MixedPrecision::gradient_divisor() const {
  return precision_ == Precision::Fp16 ? scaler_.scale() : 1.0;
}

std::vector<optim::NamedTensor> MixedPrecision::make_masters(
    const std::vector<optim::NamedTensor>& trainable, torch::Device device) const {
  if (!keeps_masters()) return trainable;
  torch::NoGradGuard no_grad;
  std::vector<optim::NamedTensor> masters;
  masters.reserve(trainable.size());
  for (const optim::NamedTensor& t : trainable)
    masters.push_back(
        {t.name, t.tensor.detach().to(device, torch::kFloat32, false, /*copy=*/true)});
  return masters;
}

bool MixedPrecision::accept_step(double grad_norm) {
  if (precision_ != Precision::Fp16) return true;
  return scaler_.update(std::isfinite(grad_norm));
}

void MixedPrecision::write_state(nlohmann::json& state) const {
  state["loss_scale"] = scaler_.scale();
  state["loss_scale_good_steps"] = scaler_.good_steps();
}

void MixedPrecision::restore_state(const nlohmann::json& state, const std::string& source) {
  try {
    scaler_.restore(state.at("loss_scale").get<double>(),
                    state.at("loss_scale_good_steps").get<std::int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(source + ": trainer_state.json: plugin state is invalid (" + e.what() + ")");
  }
}

}  // namespace tessera::train
