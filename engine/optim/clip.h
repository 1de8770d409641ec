#pragma once
// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ (norm_type 2):
// total = ‖(‖g₁‖, ‖g₂‖, …)‖, coef = min(1, max_norm / (total + 1e-6)), every gradient × coef.
// Tensors without a gradient are ignored.
#include <torch/torch.h>

#include <vector>

namespace tessera::optim {

// The global norm of the gradients (float64 result of float32 arithmetic), without clipping.
double global_grad_norm(const std::vector<torch::Tensor>& params);

// Clips in place when max_norm > 0 and returns the norm before clipping. A non-finite norm
// is returned as is and nothing is scaled (callers decide: skip the step or fail).
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace tessera::optim
