#include "optim/clip.h"

#include <algorithm>
#include <cmath>

namespace tessera::optim {
namespace {

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

std::vector<torch::Tensor> defined_of(const std::vector<torch::Tensor>& grads) {
  std::vector<torch::Tensor> defined;
  for (const torch::Tensor& g : grads)
    if (g.defined()) defined.push_back(g.detach());
  return defined;
}

// On one device in one dtype: torch's multi-tensor ops, as torch's clip_grad_norm_ uses. On a
// GPU they take the list in a few launches instead of one or two per tensor (a 1.1B llama has
// 201); on the CPU they run tensor by tensor, the same figures as the loop below.
bool one_list(const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return false;
  const torch::Tensor& first = tensors.front();
  return std::all_of(tensors.begin(), tensors.end(), [&](const torch::Tensor& t) {
    return t.device() == first.device() && t.scalar_type() == first.scalar_type();
  });
}

}  // namespace

torch::Tensor gradient_norms(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> defined = defined_of(grads);
  if (defined.empty()) return torch::zeros({0}, torch::kFloat32);
  if (one_list(defined)) return torch::stack(at::_foreach_norm(defined, 2.0)).to(torch::kFloat32);
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& g : defined) norms.push_back(g.norm(2.0).to(torch::kFloat32));
  return torch::stack(norms);
}

torch::Tensor norm_in_float64(const torch::Tensor& t) {
  constexpr std::int64_t kSlice = std::int64_t{1} << 22;  // a 32 MiB float64 copy at most
  const torch::Tensor flat = t.reshape(-1);
  if (flat.numel() <= kSlice) return at::linalg_vector_norm(flat, 2, {}, false, torch::kFloat64);
  std::vector<torch::Tensor> parts;
  for (std::int64_t at = 0; at < flat.numel(); at += kSlice)
    parts.push_back(at::linalg_vector_norm(flat.narrow(0, at, std::min(kSlice, flat.numel() - at)),
                                           2, {}, false, torch::kFloat64));
  return at::linalg_vector_norm(torch::stack(parts), 2);  // √Σ‖slice‖², in float64
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
  if (const std::optional<torch::Tensor> coef = clip_coefficient(total, max_norm)) {
    const std::vector<torch::Tensor> defined = defined_of(grads);
    if (one_list(defined))
      at::_foreach_mul_(defined, coef->to(defined.front().options()));
    else
      for (const torch::Tensor& g : defined) g.mul_(coef->to(g.scalar_type()));
  }
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
