#pragma once
// AdamW with the numerics of torch.optim.AdamW (single-tensor path, foreach=False):
//   p ← p·(1 − lr·wd)                           decoupled weight decay, applied first
//   m ← lerp(m, g, 1 − β1);  v ← β2·v + (1 − β2)·g²
//   p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)   (ε outside the square root)
// The optimizer holds only its state (m, v, step); the parameters and their gradients belong
// to whoever calls step() (a Plugin), so a plugin can place them where it likes.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

class AdamW {
 public:
  // `params`: the (float32) tensors the optimizer updates, by name. Their `.grad()` is read in
  // step(); a parameter without a gradient is skipped, as torch does.
  AdamW(std::vector<NamedTensor> params, AdamWOptions options);

  // One update with learning rate `lr`. Runs under NoGradGuard.
  void step(double lr);

  std::int64_t steps_taken() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  const std::vector<NamedTensor>& params() const { return params_; }

  // State as named tensors: "exp_avg.<name>", "exp_avg_sq.<name>" (float32, same shapes as the
  // parameters; absent for a parameter never updated), for checkpoints.
  std::vector<NamedTensor> state_tensors() const;
  // Restores what state_tensors() returned plus the step count. Throws tessera::Error
  // (InvalidInput) naming `source` and the tensor when a name is unknown or a shape differs.
  void load_state(const std::map<std::string, torch::Tensor>& tensors, std::int64_t steps,
                  const std::string& source);
  // Bytes held by m and v.
  std::uint64_t state_bytes() const;

 private:
  struct Slot {
    torch::Tensor exp_avg;
    torch::Tensor exp_avg_sq;
  };
  std::vector<NamedTensor> params_;
  std::vector<Slot> slots_;
  AdamWOptions options_;
  std::int64_t step_ = 0;
};

}  // namespace tessera::optim
