#include "optim/clip.h"

#include <cmath>

namespace tessera::optim {
namespace {

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

}  // namespace

torch::Tensor gradient_norms(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& g : grads)
    if (g.defined()) norms.push_back(g.detach().norm(2.0).to(torch::kFloat32));
  if (norms.empty()) return torch::zeros({0}, torch::kFloat32);
  return torch::stack(norms);
}

torch::Tensor total_norm(const torch::Tensor& norms) {
  torch::NoGradGuard no_grad;
  if (norms.numel() == 0) return torch::zeros({}, torch::kFloat32);
  return norms.norm(2.0);
}

std::optional<torch::Tensor> clip_coefficient(const torch::Tensor& total, double max_norm) {
  torch::NoGradGuard no_grad;
  if (max_norm <= 0.0 || !std::isfinite(total.item<double>())) return std::nullopt;
  // torch multiplies by the clamped coefficient even when it is 1, computed in float32.
  return (max_norm / (total + 1e-6)).clamp_max(1.0);
}

double apply_clip_coefficient(const std::vector<torch::Tensor>& grads, const torch::Tensor& total,
                              double max_norm) {
  torch::NoGradGuard no_grad;
  if (const std::optional<torch::Tensor> coef = clip_coefficient(total, max_norm))
    for (const torch::Tensor& g : grads)
      if (g.defined()) g.mul_(coef->to(g.scalar_type()));
  return total.item<double>();
}

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  return total_norm(gradient_norms(grads_of(params))).item<double>();
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  const std::vector<torch::Tensor> grads = grads_of(params);
  return apply_clip_coefficient(grads, total_norm(gradient_norms(grads)), max_norm);
}

}  // namespace tessera::optim
