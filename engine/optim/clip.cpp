#include "optim/clip.h"

#include <cmath>

namespace tessera::optim {
namespace {

torch::Tensor norm_tensor(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2.0).to(torch::kFloat32));
  if (norms.empty()) return torch::zeros({}, torch::kFloat32);
  return torch::stack(norms).norm(2.0);
}

}  // namespace

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  return norm_tensor(params).item<double>();
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  torch::Tensor total = norm_tensor(params);
  const double norm = total.item<double>();
  if (max_norm <= 0.0 || !std::isfinite(norm)) return norm;
  // torch multiplies by the clamped coefficient even when it is 1, computed in float32.
  torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) p.grad().mul_(coef.to(p.grad().scalar_type()));
  return norm;
}

}  // namespace tessera::optim
