#pragma once
// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ (norm_type 2):
// total = ‖(‖g₁‖, ‖g₂‖, …)‖, coef = min(1, max_norm / (total + 1e-6)), every gradient × coef.
// Tensors without a gradient are ignored.
//
// In two halves for plugins that hold gradients themselves or combine the norm across ranks in
// between: gradient_norms() (the local per-tensor norms), then total_norm() over all of them
// and apply_clip_coefficient().
#include <torch/torch.h>

#include <optional>
#include <vector>

namespace tessera::optim {

// The global norm of the gradients (float64 result of float32 arithmetic), without clipping.
double global_grad_norm(const std::vector<torch::Tensor>& params);

// Clips in place when max_norm > 0 and returns the norm before clipping. A non-finite norm
// is returned as is and nothing is scaled (callers decide: skip the step or fail).
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

// The 2-norm of `t` in float64 (a float64 scalar tensor on t's device), a slice of it at a time:
// at::linalg_vector_norm with dtype float64 first copies the whole tensor to float64, twice a
// float32 gradient's bytes at the peak (a share of a 128k × 4096 embedding: 4 GiB).
torch::Tensor norm_in_float64(const torch::Tensor& t);

// The norm of each gradient (float32, one element per defined tensor of `grads`).
torch::Tensor gradient_norms(const std::vector<torch::Tensor>& grads);
// ‖norms‖ as a float32 scalar tensor (0 for no norms).
torch::Tensor total_norm(const torch::Tensor& norms);
// min(1, max_norm / (total + 1e-6)) as a float32 scalar tensor, as torch computes it; nothing
// when max_norm <= 0 or the total is not finite (then no gradient is scaled).
std::optional<torch::Tensor> clip_coefficient(const torch::Tensor& total, double max_norm);
// Multiplies every gradient by clip_coefficient(total, max_norm) when there is one; returns the
// total as a double.
double apply_clip_coefficient(const std::vector<torch::Tensor>& grads, const torch::Tensor& total,
                              double max_norm);

}  // namespace tessera::optim
